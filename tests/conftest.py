import os

import pytest

# Triton kernels only run on the CPU through the interpreter, which must be set
# before triton/sglang are imported: `make test` exports it; refuse to run without.
if os.environ.get("TRITON_INTERPRET") != "1" and not os.environ.get("HOSTSYNC_GPU_TESTS"):
    raise pytest.UsageError("run the tests through `make test` (TRITON_INTERPRET=1 must be set)")


def pytest_collection_modifyitems(session, config, items):
    # pytest exits 5 ("no tests collected") with success-like silence; make it an error.
    if not items and not config.getoption("keyword") and not config.getoption("markexpr"):
        raise pytest.UsageError("no tests collected: the suite must never be empty")
    # Child processes (helpers.run_python, run_process) come from a fork server that preloads torch & co.
    # (tests/forkserver.py): start it now, so it preloads while the first tests run.
    files = {str(item.path) for item in items}
    if any("run_python" in text or "run_process" in text for text in (open(f).read() for f in files)):
        import forkserver

        forkserver.launch()


@pytest.fixture(autouse=True)
def _no_hook_registry_leak():
    """In-process tests may not leave hooks behind (hook-applying tests run in
    subprocesses, see helpers.run_python)."""
    from sglang.srt import plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    before = ({k: list(v) for k, v in HookRegistry._hooks.items()}, set(HookRegistry._patched))
    yield
    after = ({k: list(v) for k, v in HookRegistry._hooks.items() if v}, set(HookRegistry._patched))
    HookRegistry.reset()
    plugins._plugins_loaded = False
    assert after == ({k: v for k, v in before[0].items() if v}, before[1]), "test leaked HookRegistry state"


@pytest.fixture
def nnp_enabled(monkeypatch):
    """dspark_draft.enable_num_token_non_padded() reads the parallel layout; set it per case."""
    from sglang.srt.speculative.dspark_components import dspark_draft

    flag = {"on": True}
    monkeypatch.setattr(dspark_draft, "enable_num_token_non_padded", lambda: flag["on"])
    return flag


@pytest.fixture(params=["python", "cuda"])
def staging_impl(request, monkeypatch):
    """Both ways a CUDA stager issues its copies (GPU tests): every stager made
    lazily in the test takes this one."""
    from sglang_hostsync_plugin import csrc, staging

    if request.param == "cuda" and csrc.unavailable_reason():
        pytest.skip(f"csrc: {csrc.unavailable_reason()}")
    monkeypatch.setattr(staging, "_impl", request.param)
    monkeypatch.setenv(staging.ENV_IMPL, request.param)  # asked for: csrc loaded at the first allocation
    return request.param


@pytest.fixture
def jit_calls(monkeypatch):
    """The kernels entering Triton's JIT dispatch (``JITFunction.run``) during the test, in order:
    a replayed launch must not appear (GPU tests of the replaying slots)."""
    from triton.runtime.jit import JITFunction

    calls = []
    real = JITFunction.run

    def run(self, *a, **kw):
        calls.append(self)
        return real(self, *a, **kw)

    monkeypatch.setattr(JITFunction, "run", run)
    return calls


def pytest_sessionfinish(session, exitstatus):
    """Stop the fork server (tests/forkserver.py) if this session started one."""
    import sys

    forkserver = sys.modules.get("forkserver")
    if forkserver is not None:
        forkserver.stop()
        if os.environ.get("HOSTSYNC_TEST_FORKSERVER_DEBUG"):
            print("\nforkserver fallbacks:", *forkserver.FALLBACKS, sep="\n  ")
