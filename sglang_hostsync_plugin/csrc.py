"""The ``csrc/`` kernels: CUDA C++ built on first use with ``torch.utils.cpp_extension``.

A kernel is built only where a GPU toolchain exists (a CUDA torch, a CUDA device and
nvcc); elsewhere ``unavailable_reason`` says why and callers use their Triton path.
Build output goes to torch's extension cache (``TORCH_EXTENSIONS_DIR``).
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
import os
import shutil

from .config import HostsyncConfigError

logger = logging.getLogger("sglang.srt.plugins.hostsync")

# nvcc's own warnings are errors: the sources must compile warning-free.
NVCC_FLAGS = ("-O3", "-Werror", "all-warnings")


def source_path(name: str) -> str:
    """Path of ``csrc/<name>``: in the source tree (a checkout or an editable
    install), else the copy installed as package data ``sglang_hostsync_plugin._csrc``."""
    in_tree = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc", name)
    if os.path.exists(in_tree):
        return in_tree
    return str(importlib.resources.files("sglang_hostsync_plugin._csrc") / name)


def unavailable_reason() -> str | None:
    """None when CUDA C++ extensions can be built and run here, else why not."""
    import torch
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        return "torch is built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if cpp_extension.CUDA_HOME is None or shutil.which("nvcc", path=f"{cpp_extension.CUDA_HOME}/bin") is None:
        return "no nvcc (CUDA_HOME not found)"
    return None


@functools.cache
def load(name: str, verbose: bool = False):
    """Build (once per process; cached on disk by torch) and import ``csrc/<name>.cu``."""
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


def choose_impl(env_var: str, fallback: str, env) -> tuple[str, str]:
    """(implementation, why) from ``env_var`` = ``auto`` | ``<fallback>`` | ``cuda``:
    ``auto`` takes the csrc one (``cuda``) where it can be built, else ``fallback``."""
    choices = ("auto", fallback, "cuda")
    wanted = env.get(env_var, "auto").strip().lower() or "auto"
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
