"""The ``csrc/`` kernels: CUDA C++ built on first use with ``torch.utils.cpp_extension``.

A kernel is built only where a GPU toolchain exists (a CUDA torch, a CUDA device and
nvcc); elsewhere ``unavailable_reason`` says why and callers use their Triton path.
Build output goes to torch's extension cache (``TORCH_EXTENSIONS_DIR``).
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import shutil
import subprocess
import sys
import threading
import time

from .config import HostsyncConfigError

logger = logging.getLogger("sglang.srt.plugins.hostsync")

# nvcc's own warnings are errors: the sources must compile warning-free.
NVCC_FLAGS = ("-O3", "-Werror", "all-warnings")


KERNELS = ("eagle_tail", "h2d_stage")
# Under ``auto`` a slot's prepare waits this long for its kernel; past it the
# fallback serves and the kernel takes over once loaded (a cold extension cache).
AUTO_WAIT_S = 1.0


def source_path(name: str) -> str:
    """Path of ``csrc/<name>``: the copy installed as package data
    ``sglang_hostsync_plugin._csrc``, or in a source checkout (an editable install,
    where the package dir sits next to ``csrc/`` and ``setup.py``)."""
    try:
        packaged = importlib.resources.files("sglang_hostsync_plugin._csrc") / name
        if packaged.is_file():
            return str(packaged)
    except ModuleNotFoundError:  # a checkout on sys.path, not installed
        pass
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.exists(os.path.join(root, "setup.py")):
        return os.path.join(root, "csrc", name)
    raise FileNotFoundError(f"csrc/{name} is not installed with sglang_hostsync_plugin")


def unavailable_reason() -> str | None:
    """None when CUDA C++ extensions can be built and run here, else why not."""
    import torch

    if torch.version.cuda is None:
        return "torch is built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device"
    from torch.utils import cpp_extension  # after the checks: it imports setuptools (0.4 s on a CPU host)

    if cpp_extension.CUDA_HOME is None or shutil.which("nvcc", path=f"{cpp_extension.CUDA_HOME}/bin") is None:
        return "no nvcc (CUDA_HOME not found)"
    return None


_modules: dict = {}
_locks: dict[str, threading.Lock] = {}


def loaded(name: str) -> bool:
    """Whether ``csrc/<name>.cu`` is loaded in this process (never waits)."""
    return name in _modules


def load(name: str, verbose: bool = False):
    """Build (once per process; cached on disk by torch) and import ``csrc/<name>.cu``.
    Thread-safe: a second caller waits for the first's load instead of loading twice."""
    module = _modules.get(name)
    if module is not None:
        return module
    with _locks.setdefault(name, threading.Lock()):
        module = _modules.get(name)
        if module is None:
            module = _modules[name] = _build(name, verbose)
    return module


def _build(name: str, verbose: bool):
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"cannot build csrc/{name}.cu: {reason}")
    from torch.utils import cpp_extension

    module = cpp_extension.load(
        name=f"hostsync_{name}",
        sources=[source_path(f"{name}.cu")],
        extra_cuda_cflags=list(NVCC_FLAGS),
        verbose=verbose,
    )
    logger.info("hostsync: built csrc/%s.cu", name)
    return module


_prebuild: subprocess.Popen | None = None


def start_prebuild(names: tuple[str, ...]) -> subprocess.Popen | None:
    """Start building ``names`` in a background process (once per process), so the
    build overlaps model loading; ``load`` in a scheduler then waits on torch's build
    lock (on a thread, under ``auto``: ``load_in_background``) or loads from its cache.
    Returns the process, or None when nothing to do."""
    global _prebuild
    if not names or _prebuild is not None:
        return None
    _prebuild = subprocess.Popen([sys.executable, "-m", "sglang_hostsync_plugin", "prebuild", *names],
                                 stdin=subprocess.DEVNULL)
    logger.info("hostsync: building csrc %s in the background, or loading it from torch's extension cache "
                "(pid %d); schedulers load it after their init (a slot under auto waits at most %.0f s)",
                ", ".join(f"{n}.cu" for n in names), _prebuild.pid, AUTO_WAIT_S)
    return _prebuild


def prebuild(names: tuple[str, ...] = KERNELS) -> int:
    """Build (or load from torch's extension cache) each kernel; 0 when all built,
    or when nothing can be built here (no CUDA toolchain: the Python paths are used)."""
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        print(f"hostsync prebuild: unknown kernel(s) {unknown}; known: {', '.join(KERNELS)}", file=sys.stderr)
        return 2
    reason = unavailable_reason()
    if reason:
        print(f"hostsync prebuild: nothing built ({reason}); the slots use their Triton/Python paths")
        return 0
    rc = 0
    for name in names:
        t0 = time.perf_counter()
        try:
            load(name)
        except Exception as exc:  # a build error names the kernel and goes on with the next
            print(f"hostsync prebuild: csrc/{name}.cu FAILED: {exc}", file=sys.stderr)
            rc = 1
            continue
        print(f"hostsync prebuild: csrc/{name}.cu ready ({time.perf_counter() - t0:.1f} s)", flush=True)
    return rc


_loading: dict[str, list[threading.Thread]] = {}


def load_before_ready(name: str) -> str:
    """``load(name)`` in a slot's ``prepare`` when ``cuda`` was asked for: blocks; a failure raises."""
    t0 = time.perf_counter()
    load(name)
    return f"csrc/{name}.cu loaded in {time.perf_counter() - t0:.1f} s"


def load_in_background(slot: str, name: str, on_loaded, on_failed=None, wait: float | None = None) -> str:
    """``load(name)`` on a thread, when ``auto`` chose csrc: waited on for at most ``wait``
    (default ``AUTO_WAIT_S``) while the caller's fallback serves. ``on_loaded()`` runs once it
    is loaded; a failure is a warning and ``on_failed()``. Returns a note for the log."""
    t0 = time.perf_counter()
    lock = threading.Lock()
    state: dict = {"done": False, "late": False, "error": None}

    def background() -> None:
        try:
            load(name)
            on_loaded()
        except Exception as exc:  # noqa: BLE001 (the fallback keeps serving; nothing reaches the loop)
            logger.warning("hostsync: %s: csrc/%s.cu unavailable (%s); using the fallback path", slot, name, exc)
            if on_failed is not None:
                on_failed()
            with lock:
                state["done"], state["error"] = True, exc
            return
        with lock:
            state["done"], late = True, state["late"]
        if late:
            logger.info("hostsync: %s: csrc/%s.cu loaded %.1f s after its load began (background thread); "
                        "it serves from now on", slot, name, time.perf_counter() - t0)

    thread = threading.Thread(target=background, name=f"hostsync-load-{name}", daemon=True)
    _loading.setdefault(name, []).append(thread)
    thread.start()
    thread.join(AUTO_WAIT_S if wait is None else wait)
    with lock:
        state["late"] = not state["done"]
    if state["late"]:
        return (f"csrc/{name}.cu still building after {time.perf_counter() - t0:.1f} s (the launcher's "
                "prebuild); the fallback serves until it is loaded")
    if state["error"] is not None:
        return f"fallback: {state['error']}"
    return f"csrc/{name}.cu loaded in {time.perf_counter() - t0:.1f} s"


def loading(name: str) -> bool:
    """Whether a background load of ``name`` is still running (never waits)."""
    return any(thread.is_alive() for thread in _loading.get(name, ()))


def wait_loaded(name: str, timeout: float | None = None) -> bool:
    """Wait for the background ``load_in_background`` calls of ``name``; True when none is running."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread in list(_loading.get(name, ())):
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return not loading(name)


def asked_for_cuda(env_var: str, env=None) -> bool:
    """Whether ``env_var`` asks for the csrc kernel explicitly (``cuda``, not ``auto``)."""
    return _wanted(env_var, os.environ if env is None else env) == "cuda"


def _wanted(env_var: str, env) -> str:
    return env.get(env_var, "auto").strip().lower() or "auto"


def choose_impl(env_var: str, fallback: str, env) -> tuple[str, str]:
    """(implementation, why) from ``env_var`` = ``auto`` | ``<fallback>`` | ``cuda``:
    ``auto`` takes the csrc one (``cuda``) where it can be built, else ``fallback``."""
    choices = ("auto", fallback, "cuda")
    wanted = _wanted(env_var, env)
    if wanted not in choices:
        raise HostsyncConfigError(f"{env_var}={wanted!r}: use one of {', '.join(choices)}")
    if wanted == fallback:
        return fallback, f"{env_var}={fallback}"
    missing = unavailable_reason()
    if wanted == "cuda":
        if missing:
            raise HostsyncConfigError(f"{env_var}=cuda but csrc cannot be built here: {missing}")
        return "cuda", f"{env_var}=cuda"
    if missing:
        return fallback, f"auto: csrc unavailable ({missing})"
    return "cuda", "auto: csrc where it builds"
