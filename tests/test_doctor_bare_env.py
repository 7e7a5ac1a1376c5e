"""The doctor and ``--help`` in a Python without torch, triton or SGLang (the plugin's own
install requirements leave them out): ``pip install sglang-hostsync-plugin`` into a fresh venv.

The child runs ``python -m sglang_hostsync_plugin`` with a ``sitecustomize`` on PYTHONPATH whose
meta-path finder makes ``import torch`` (``triton``, ``sglang``) raise ModuleNotFoundError, as in
that venv; without torch the child starts in a fraction of a second."""

import json
import subprocess
import sys

import pytest

from helpers import REPO, clean_env, out

BLOCKER = '''
import sys

BLOCKED = {blocked!r}


class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Blocked())
'''


def run_without(tmp_path, blocked, *argv):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER.format(blocked=tuple(blocked)))
    env = clean_env(PYTHONPATH=str(tmp_path))
    # The blocker reports what was imported at exit: nothing of the blocked packages got in.
    code = ("import runpy, sys; sys.argv = ['sglang-hostsync', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('sglang_hostsync_plugin', run_name='__main__', alter_sys=True)\n"
            "finally:\n    print('IMPORTED', sorted(m for m in sys.modules if m.partition('.')[0] in "
            f"{tuple(blocked)!r}), file=sys.stderr)\n")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env,
                          timeout=120, cwd=REPO)


ALL = ("torch", "triton", "sglang")


def test_blocker_blocks(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER.format(blocked=ALL))
    proc = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True,
                          env=clean_env(PYTHONPATH=str(tmp_path)), timeout=120)
    assert proc.returncode == 1 and "ModuleNotFoundError: No module named 'torch'" in proc.stderr, out(proc)


def test_doctor_json_without_torch_triton_sglang_is_a_configuration_error(tmp_path):
    proc = run_without(tmp_path, ALL, "doctor", "--json")
    assert proc.returncode == 2, out(proc)
    assert "Traceback" not in proc.stderr, out(proc)
    data = json.loads(proc.stdout)  # one JSON object, nothing else on stdout
    assert data["ok"] is False and data["slots"] == [] and data["missing"] == list(ALL)
    for name in ALL:
        assert name in data["error"], data["error"]
    assert "pip install sglang==0.5.23" in data["error"]
    assert "IMPORTED []" in proc.stderr, out(proc)


def test_doctor_table_without_torch_names_what_is_missing(tmp_path):
    proc = run_without(tmp_path, ALL, "doctor", "--speculative-algorithm", "EAGLE")
    assert proc.returncode == 2 and proc.stdout == "", out(proc)
    assert "hostsync doctor: torch, triton, sglang are not installed" in proc.stderr, out(proc)
    assert "Traceback" not in proc.stderr, out(proc)


def test_doctor_names_only_the_missing_package(tmp_path):
    proc = run_without(tmp_path, ("triton",), "doctor", "--json")
    assert proc.returncode == 2, out(proc)
    data = json.loads(proc.stdout)
    assert data["missing"] == ["triton"] and data["error"].startswith("triton is not installed"), data


@pytest.mark.parametrize("argv", [("--help",), ("doctor", "--help"), ("prebuild", "--help")])
def test_help_without_torch(tmp_path, argv):
    proc = run_without(tmp_path, ALL, *argv)
    assert proc.returncode == 0, out(proc)
    assert proc.stdout.startswith("usage: sglang-hostsync"), out(proc)
    assert "IMPORTED []" in proc.stderr, out(proc)


def test_prebuild_without_torch(tmp_path):
    proc = run_without(tmp_path, ALL, "prebuild")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, out(proc)
    assert "hostsync prebuild: torch is not installed" in proc.stderr, out(proc)
