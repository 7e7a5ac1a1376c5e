import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_python(code: str, timeout: float = 300, pythonpath: str | None = None, **env) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter: HookRegistry patches are process-global."""
    e = clean_env(**env)
    if pythonpath:
        e["PYTHONPATH"] = pythonpath + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout, env=e, cwd=REPO,
    )


def out(proc: subprocess.CompletedProcess) -> str:
    return f"--- rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-6000:]}"
