"""The SGLang release this plugin is written against, and the guard for it."""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

from .config import ENV_ALLOW_UNSUPPORTED, HostsyncConfigError, env_bool

SUPPORTED_SGLANG = "0.5.23"

logger = logging.getLogger("sglang.srt.plugins.hostsync")


def installed_sglang() -> str | None:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def check_sglang_version(installed: str | None = ..., env=None) -> str | None:
    """Raise unless the installed SGLang is the pinned one.

    With ``SGLANG_HOSTSYNC_ALLOW_UNSUPPORTED_SGLANG=1`` a mismatch is a warning (the
    per-slot shape checks still refuse slots whose targets changed); the warning
    text is returned so callers can report it.
    """
    # Ellipsis: look it up; None: no sglang installed.
    installed = installed_sglang() if installed is ... else installed
    if installed == SUPPORTED_SGLANG:
        return None
    msg = (
        f"sglang-hostsync-plugin supports sglang=={SUPPORTED_SGLANG}, but "
        f"{'sglang ' + installed if installed else 'no sglang'} is installed."
    )
    if installed is not None and env_bool(ENV_ALLOW_UNSUPPORTED, False, env):
        warning = f"{msg} Running anyway ({ENV_ALLOW_UNSUPPORTED}=1); slots are shape-checked one by one."
        logger.warning(warning)
        return warning
    if installed is None:  # the override runs another version; it cannot stand in for none
        raise HostsyncConfigError(f"{msg} Install sglang=={SUPPORTED_SGLANG}.")
    raise HostsyncConfigError(
        f"{msg} Install sglang=={SUPPORTED_SGLANG}, or set {ENV_ALLOW_UNSUPPORTED}=1 "
        "to run with per-slot contract checks."
    )
