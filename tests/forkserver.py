"""A fork server for the tests' child interpreters (helpers.run_python / run_process, the launcher snippets).

A child interpreter that imports SGLang spends most of its ~9 s importing torch, triton, transformers
and the rest of SGLang's third-party dependencies. The server is one interpreter that imports those
once (``PRELOAD``: third-party packages only; nothing of SGLang, of this plugin or of the tests, so no
hook, no HookRegistry state, no slot target and no SGLang module is in it: ``_preload`` refuses to
serve otherwise), then forks a child per request. The child takes the request's environment, working
directory, ``sys.path`` (PYTHONPATH), ``sys.argv`` and standard streams, and runs ``python -c CODE``,
``python -m MODULE`` or a script as the interpreter does (a fresh ``__main__``, ``sys.excepthook`` and
exit status 1 for an uncaught exception, ``SystemExit``'s status). At exit it joins non-daemon threads,
runs the atexit handlers and flushes every file left open, then leaves without tearing down its ~6000
modules one by one (~2 s, nothing a test can see). Everything SGLang and the plugin do happens in the
child, as in a fresh interpreter: only the preloaded third-party modules are shared, already imported.

A request falls back to a fresh interpreter (``subprocess.run``) where a fork could differ from one:
the environment differs from the server's in a variable the preload read or iterated over (tracked
while it ran), or that native code may read at import (``NATIVE_ENV_PREFIXES``); a PYTHONPATH entry
holds a ``sitecustomize``/``usercustomize`` (a fresh interpreter would run it at startup); the caller
asks for one (``helpers.run_process(fresh=True)``: a child that blocks torch's import); or
``HOSTSYNC_TEST_FORKSERVER=0``. ``HOSTSYNC_TEST_FORKSERVER_DEBUG=1`` lists the fallbacks at the end
of a run (without pytest-xdist: ``make test JOBS=0``).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")
ENV_SWITCH = "HOSTSYNC_TEST_FORKSERVER"  # "0": every child is a fresh interpreter

# Third-party packages a child importing SGLang loads anyway (SGLang's own imports in a child, in
# the order they are first imported). SGLang, the plugin, sgl_kernel and flashinfer (tests stand
# those in through sys.modules) are never preloaded.
PRELOAD = (
    "numpy", "orjson", "psutil", "pybase64", "urllib3", "charset_normalizer", "requests", "idna", "certifi",
    "typing_extensions", "torch", "cuda", "dill", "torchgen", "tqdm", "triton", "packaging", "PIL", "starlette", "anyio",
    "sniffio", "python_multipart", "msgspec", "pydantic_core", "zmq", "transformers", "regex", "huggingface_hub",
    "jinja2", "markupsafe", "httpx", "zstandard", "click", "pygments", "rich", "yaml", "filelock", "httpcore", "h11",
    "tokenizers", "mpmath", "sympy", "safetensors", "torchvision", "IPython", "traitlets", "pydantic",
    "typing_inspection", "multidict", "aiohttp", "attr", "yarl", "propcache", "aiohappyeyeballs", "frozenlist",
    "aiosignal", "pluggy", "sentencepiece", "tvm_ffi", "functorch", "networkx", "annotated_types", "openai", "distro",
    "partial_json_parser", "loguru", "compressed_tensors", "gguf", "opentelemetry", "einops", "fsspec",
    "setproctitle", "uvicorn", "annotated_doc", "fastapi", "uvloop",
    # The slow submodules SGLang reaches past those packages' own imports.
    "torch._inductor.kernel.flex.common", "torch._inductor.decomposition", "transformers.processing_utils",
    "transformers.modeling_utils", "transformers.models.auto", "transformers.generation.utils",
    "transformers.models.llama.modeling_llama", "safetensors.torch", "torch.distributed", "aiohttp.web",
)
NEVER = ("sglang", "sglang_hostsync_plugin", "sgl_kernel", "flashinfer", "hostsync_drivers", "helpers", "audit_cases")

# Variables native code (CUDA, torch's C++ side, OpenMP, the allocator, the dynamic loader, Python's
# own startup) may read at import, out of the tracking's sight: a difference in one is never forked.
NATIVE_ENV_PREFIXES = ("CUDA", "NV", "TORCH", "PYTORCH", "NCCL", "OMP", "KMP", "GOMP", "MKL", "OPENBLAS", "LD_",
                       "MALLOC", "PYTHON", "TRITON", "HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "XDG_",
                       "LC_", "LANG", "TZ", "HOME", "PATH", "TMP", "TEMP", "USER", "SHELL")
# Of those, what SGLang's launcher sets for the processes it starts (its caches, its CUDA and NCCL settings):
# read when a kernel is built (triton's knobs), a CUDA context made or NCCL set up, never at an import.
READ_LATER = ("TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_CUMEM_ENABLE",
              "NCCL_NVLS_ENABLE")

# The preloaded modules that iterate os.environ, and the prefix each keeps (read from their source).
ITERATED_BY = {"/fsspec/config.py": "FSSPEC_", "/networkx/utils/backends.py": "NETWORKX_", "/tqdm/utils.py": "TQDM_"}


# --- the server -------------------------------------------------------------------------------

class _TrackingEnviron(os._Environ):
    """os.environ that records which variables are read while ``tracking`` (the preload)."""

    def __init__(self, base):
        super().__init__(base._data, base.encodekey, base.decodekey, base.encodevalue, base.decodevalue)
        self.tracking = True
        self.read: set[str] = set()
        self.iterated: set[str] = set()
        self.iterating: set = set()  # their code objects
        self.written: dict[str, str | None] = {}  # what the preload set (None: removed), in order

    def __setitem__(self, key, value):
        if self.tracking:
            self.written[key] = value
        super().__setitem__(key, value)

    def __delitem__(self, key):
        if self.tracking:
            self.written[key] = None
        super().__delitem__(key)

    def __getitem__(self, key):
        if self.tracking and not self._in_iteration():
            self.read.add(key)
        return super().__getitem__(key)

    def __iter__(self):
        if self.tracking:  # who iterates (items(), copy(), dict(os.environ)): the first caller outside the stdlib
            frame = _caller(sys._getframe(1))
            self.iterated.add(frame.f_code.co_filename if frame else "?")
            self.iterating.add(frame.f_code if frame else None)
        return super().__iter__()

    def _in_iteration(self) -> bool:
        """A value read by an iteration (recorded as the iteration, with its filter): items()/values()
        read each key's value, so does dict(os.environ) (from C, for its caller)."""
        frame = sys._getframe(2)
        if frame.f_code.co_filename.startswith("<frozen _collections_abc") and frame.f_code.co_name == "__iter__":
            return True
        frame = _caller(frame)
        return frame is not None and frame.f_code in self.iterating


def _caller(frame):
    """The first frame outside os and _collections_abc."""
    while frame and (frame.f_code.co_filename.startswith("<frozen") or frame.f_code.co_filename == os.__file__):
        frame = frame.f_back
    return frame


def _preload() -> dict:
    start = dict(os.environ)
    env = _TrackingEnviron(os.environ)
    os.environ = env
    loaded, failed = [], []
    t0 = time.monotonic()
    for name in PRELOAD:
        try:
            __import__(name)
            loaded.append(name)
        except Exception as exc:  # not installed here: the child imports it itself, if at all
            failed.append(f"{name}: {type(exc).__name__}")
    env.tracking = False
    bad = sorted(m for m in sys.modules if m.partition(".")[0] in NEVER)
    if bad:  # a preloaded package pulled one in: refuse to serve (every request falls back)
        raise RuntimeError(f"forkserver preload imported {bad}")
    return {"read": sorted(env.read), "iterated": sorted(env.iterated), "loaded": loaded, "failed": failed,
            "seconds": round(time.monotonic() - t0, 2), "threads": threading.active_count(),
            "tasks": len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None,
            "env": start, "written": env.written, "path": list(sys.path)}


def _recv_exact(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def serve(path: str):
    """The server loop: returns (in a forked child only) the request it is to run."""
    info = _preload()
    global _INFO
    _INFO = info
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("READY " + json.dumps(info) + "\n")
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)  # the client stops reading; nothing more goes there
    os.close(null)
    waiting: dict[int, socket.socket] = {}  # child pid -> its client's connection
    while True:
        ready, _, _ = select.select([listener], [], [], 0.05)
        if ready:
            conn, _ = listener.accept()
            try:
                head, fds, _, _ = socket.recv_fds(conn, 8, 3)
                head += _recv_exact(conn, 8 - len(head))
                req = json.loads(_recv_exact(conn, struct.unpack("!Q", head)[0]))
            except Exception:
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in waiting.values():
                    other.close()
                conn.close()
                for target, fd in zip((0, 1, 2), fds):
                    os.dup2(fd, target)
                    os.close(fd)
                return req
            for fd in fds:
                os.close(fd)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            waiting[pid] = conn
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(json.dumps({"rc": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                except OSError:
                    pass
                conn.close()
        # The client is gone (pytest exited without stopping us): stop.
        if os.getppid() == 1:
            os._exit(0)


def run_child(req: dict):
    """In the forked child: become ``python -c CODE``, ``python -m MODULE`` or ``python SCRIPT`` with the
    request's arguments, environment and working directory, run it and exit."""
    import builtins
    import importlib
    import types

    os.chdir(req["cwd"])
    env = req["env"]
    os.environ.clear()
    os.environ.update(env)
    for key, value in _INFO["written"].items():  # what the preloaded modules' imports did to the environment
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    mode, target = req["mode"], req["target"]
    # sys.path[0]: "" for -c, the working directory for -m, the script's directory for a script.
    first = {"-c": "", "-m": os.getcwd(), "script": os.path.dirname(os.path.realpath(target))}[mode]
    base = [p for p in sys.path if p not in _SERVER_PYTHONPATH and p != ""]
    sys.path[:] = [first, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p], *base]
    importlib.invalidate_caches()
    sys.argv = [{"-c": "-c", "-m": target, "script": target}[mode], *req["args"]]
    if "numpy" in sys.modules:  # a fresh interpreter seeds numpy's global generator from the OS
        sys.modules["numpy"].random.seed()
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    global SOCKET
    SOCKET = _SOCKET_OF_SERVER  # grandchildren of this child come from the same server
    code = target
    del req, env
    try:
        if mode == "-m":  # what `python -m` calls (sets sys.argv[0] to the module's file)
            import runpy

            runpy._run_module_as_main(target)
        else:
            if mode == "script":
                main.__dict__["__file__"] = target
                with open(target, "rb") as f:
                    code = f.read()
            exec(compile(code, "<string>" if mode == "-c" else target, "exec"), main.__dict__)
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException as exc:  # what the interpreter does with an uncaught exception
        sys.excepthook(type(exc), exc, exc.__traceback__.tb_next)
        status = 1
    _exit(status)


def _exit_status(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _exit(status: int):
    """The interpreter's exit as the tests can see it (non-daemon threads joined, atexit handlers run,
    unclosed files flushed), without tearing down the ~6000 modules one by one (~2 s)."""
    import atexit
    import gc
    import io

    try:
        threading._shutdown()
    except BaseException:
        pass
    try:
        atexit._run_exitfuncs()
    except SystemExit as exc:
        status = _exit_status(exc)
    buffered = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)  # the C types: no ABC check per object
    for obj in gc.get_objects():  # a fresh interpreter's teardown flushes (closes) what is left open
        if isinstance(obj, buffered):
            try:
                if not obj.closed:
                    obj.flush()
            except BaseException:
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(status)


_SERVER_PYTHONPATH: set[str] = set()
_SOCKET_OF_SERVER: str | None = None
SOCKET: str | None = None  # set in the server's children: where to ask for another child
FALLBACKS: list[str] = []  # why each fresh interpreter was not forked (this process)

BOOT = """
import os, sys
import forkserver
forkserver._SERVER_PYTHONPATH = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
forkserver._SOCKET_OF_SERVER = sys.argv[1]
forkserver.run_child(forkserver.serve(sys.argv[1]))
"""


# --- the client -------------------------------------------------------------------------------

class _Server:
    def __init__(self):
        self.lock = threading.Lock()
        self.proc = None
        self.path = None
        self.info = None
        self.error = None
        self.dir = None

    def launch(self):
        """Start the server (it preloads in the background): at the session's start, or on first use."""
        with self.lock:
            if self.proc is not None or self.error is not None or os.environ.get(ENV_SWITCH) == "0":
                return
            self.dir = tempfile.mkdtemp(prefix="hostsync-forkserver-")
            self.path = os.path.join(self.dir, "sock")
            with open(os.path.join(self.dir, "server.log"), "w") as log:
                self.proc = subprocess.Popen([sys.executable, "-c", BOOT, self.path], stdout=subprocess.PIPE,
                                             stderr=log, stdin=subprocess.DEVNULL, env=_server_env(), cwd=REPO,
                                             text=True)

    def ready(self) -> bool:
        """Whether the server serves (waits for its preload the first time)."""
        self.launch()
        with self.lock:
            if self.info is None and self.error is None and self.proc is not None:
                line = self.proc.stdout.readline()
                self.proc.stdout.close()
                if line.startswith("READY "):
                    self.info = json.loads(line[len("READY "):])
                else:
                    self.proc.wait()
                    with open(os.path.join(self.dir, "server.log")) as f:
                        self.error = f"forkserver did not start: {f.read()[-3000:]}"
            return self.info is not None

    def stop(self):
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
            self.proc = self.info = self.dir = None
            self.error = "stopped"


_server = _Server()
_retired: list[_Server] = []  # servers for an environment the test process has since changed
_relaunch = threading.Lock()


def launch():
    _server.launch()


def stop():
    for server in [*_retired, _server]:
        server.stop()


def _current() -> _Server | None:
    """The test process's server, for its environment as it is now: an in-process import or SGLang's
    argument preparation may set a variable the preload read (setdefault(TORCHINDUCTOR_CACHE_DIR), for one)
    after the server started; every child then gets it, so a server started with it takes over (the one
    before serves the children it started until they exit)."""
    global _server
    server = _server
    if not server.ready():
        return None
    if forkable(_server_env(), server.info) is not None and len(_retired) < 3:
        with _relaunch:
            if _server is server:
                _retired.append(server)
                _server = _Server()
        server = _server
        if not server.ready():
            return None
    return server


def forkable(env: dict, info: dict) -> str | None:
    """Why a child with ``env`` may not be forked from a server that preloaded with ``info``; None if it may."""
    if os.environ.get(ENV_SWITCH) == "0":
        return f"{ENV_SWITCH}=0"
    base, written = info["env"], info["written"]
    # A variable the preload set is the same where the child's environment already holds that value
    # (a process of a launcher that imported those packages too).
    differ = {k for k in set(env) | set(base)
              if env.get(k) != base.get(k) and not (k in written and env.get(k) == written[k])} - {"PYTHONPATH"}
    for key in sorted(differ):
        if key in info["read"] or (key.startswith(NATIVE_ENV_PREFIXES) and key not in READ_LATER):
            return f"{key} differs and may have been read at the preload"
        for path in info["iterated"]:
            prefix = next((p for suffix, p in ITERATED_BY.items() if path.endswith(suffix)), "")
            if key.startswith(prefix):  # "": an iteration not known to filter: any difference
                return f"{key} differs and {path} iterated os.environ at the preload"
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        if entry and any(os.path.exists(os.path.join(entry, n)) for n in ("sitecustomize.py", "usercustomize.py")):
            return f"{entry} holds a site customization"
    return None


def _server_env() -> dict:
    """helpers.clean_env() with tests/ on the path: what run_python's children get, less their own settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = TESTS
    return env


def _ask(path: str, req: dict, timeout: float | None):
    """(returncode, stdout, stderr) of the request run by the server at ``path``."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            open(os.devnull) as null, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        payload = json.dumps(req).encode()
        reader = conn.makefile("r")
        try:
            conn.connect(path)
            socket.send_fds(conn, [struct.pack("!Q", len(payload))], [null.fileno(), out.fileno(), err.fileno()])
            conn.sendall(payload)
            pid = json.loads(reader.readline())["pid"]
        except (OSError, ValueError) as exc:
            raise _NotStarted(exc) from exc
        conn.settimeout(timeout)
        try:
            line = reader.readline()
        except (socket.timeout, TimeoutError):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
            out.seek(0)
            err.seek(0)
            raise subprocess.TimeoutExpired(["python", "-c", "..."], timeout, output=out.read(), stderr=err.read())
        if not line:
            raise RuntimeError(f"forkserver: no exit status for child {pid} (the server died)")
        rc = json.loads(line)["rc"]
        out.seek(0)
        err.seek(0)
        return rc, out.read(), err.read()


def _request(argv) -> dict | None:
    """What the child is to run, for a command line ``python`` would run the same way; None otherwise."""
    argv = list(argv)
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] in ("-c", "-m"):
        return {"mode": argv[1], "target": argv[2], "args": argv[3:]}
    if argv and os.path.isfile(argv[0]) and os.access(argv[0], os.X_OK):  # a script run through its #! line
        with open(argv[0], "rb") as f:
            first = f.readline().decode(errors="replace").strip()
        if first == "#!" + sys.executable:
            return {"mode": "script", "target": os.path.abspath(argv[0]), "args": argv[1:]}
    return None


def run(argv, *, env: dict, cwd: str = REPO, timeout: float | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)``, forked
    from the server where that is the same (see the module's docstring): ``argv`` is ``[sys.executable,
    "-c" or "-m", ...]`` or a script whose ``#!`` line names ``sys.executable``."""
    path, info = SOCKET, _INFO  # a child of the server: the server's view of itself came down with the fork
    if path is None:  # the test process
        server = _current()
        path, info = (server.path, server.info) if server else (None, None)
    req = _request(argv)
    why = ("no server" if path is None or info is None else "not a python command line" if req is None
           else forkable(env, info))
    if why is not None:
        FALLBACKS.append(why)
        return subprocess.run(list(argv), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    try:
        rc, stdout, stderr = _ask(path, {**req, "env": env, "cwd": cwd}, timeout)
    except _NotStarted as exc:  # the server is gone: a fresh interpreter
        FALLBACKS.append(f"server gone: {exc}")
        return subprocess.run(list(argv), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    return subprocess.CompletedProcess(list(argv), rc, stdout, stderr)


class _NotStarted(Exception):
    """The server did not start the child (nothing ran)."""


_INFO: dict | None = None
