"""Per-process lifecycle of the enabled plugin.

``activate()`` runs inside SGLang's ``load_plugins()`` (so it must not raise: the
loader only logs). It records any configuration error and installs the selected
slots. ``startup_check()`` runs from the first hook SGLang calls after loading
(``ServerArgs.__post_init__`` for an embedded Engine, ``Scheduler.__init__`` in
every scheduler/TP process): it raises the recorded error, verifies the hooks,
logs the status block and, after the scheduler has built its process groups,
agrees on the slot set with every other rank.
"""

from __future__ import annotations

import logging

from . import config, installer, ranks, registry, report, version

logger = logging.getLogger("sglang.srt.plugins.hostsync")

SERVER_ARGS_POST_INIT = "sglang.srt.server_args.ServerArgs.__post_init__"
SCHEDULER_INIT = "sglang.srt.managers.scheduler.Scheduler.__init__"


class HostsyncStartupError(RuntimeError):
    pass


class Runtime:
    def __init__(self):
        self.error: Exception | None = None
        self.state = installer.InstallState()
        self.selection: config.Selection | None = None
        self.version_warning: str | None = None
        self.reported = False


_runtime: Runtime | None = None


def current() -> Runtime | None:
    return _runtime


def _hook_registry_register(path: str, hook, kind: str) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(path, hook, HookType.AROUND if kind == "around" else HookType.REPLACE)


def validate() -> config.Selection:
    """Everything the launcher checks before any model load; raises on bad input."""
    version.check_sglang_version()
    strict = config.strict_mode()  # raises on a malformed value
    catalogue = registry.catalogue()
    selection = config.selected_slots(catalogue)
    if strict:
        refused = [r for r in report.doctor_rows({n: catalogue[n] for n in selection.names}) if r.reason]
        if refused:
            raise HostsyncStartupError(
                "hostsync: selected slots cannot be applied to this SGLang (strict mode): "
                + "; ".join(f"{r.name}: {r.reason}" for r in refused)
            )
    return selection


def activate(error: Exception | None = None) -> Runtime:
    """Install the selected slots in this process; with ``error``, only the gates
    that will raise it at startup."""
    global _runtime
    rt = Runtime()
    _runtime = rt
    try:
        if error is not None:
            raise error
        rt.version_warning = version.check_sglang_version()
        catalogue = registry.catalogue()
        rt.selection = config.selected_slots(catalogue)
        config.strict_mode()
    except (config.HostsyncConfigError, registry.SlotRegistryError) as exc:
        rt.error = exc
        logger.error("hostsync: %s", exc)
    else:
        installer.install(
            rt.state, [catalogue[n] for n in rt.selection.names], _hook_registry_register
        )
        installer.mark_unselected(rt.state, catalogue, rt.selection.names)
    _hook_registry_register(SERVER_ARGS_POST_INIT, _server_args_gate, "around")
    _hook_registry_register(SCHEDULER_INIT, _scheduler_gate, "around")
    return rt


def startup_check(rt: Runtime) -> None:
    if rt.error is not None:
        raise rt.error
    if not rt.state.verified:
        installer.verify(rt.state)
    if not rt.reported:
        rt.reported = True
        selection = rt.selection.spec if rt.selection else "?"
        # A failed slot in lenient mode must be visible at default log levels.
        logger.log(
            logging.WARNING if rt.state.failed() else logging.INFO,
            report.format_status_block(
                rt.state,
                f"hostsync: sglang {version.installed_sglang()}, "
                f"{config.ENV_SLOTS}={selection!r}, strict={config.strict_mode()}",
            )
        )
    failed = rt.state.failed()
    if failed and config.strict_mode():
        raise HostsyncStartupError(
            "hostsync: slot(s) failed in strict mode: "
            + "; ".join(f"{s.name}: {s.reason}" for s in failed)
            + f". Deselect them with {config.ENV_SLOTS} or set {config.ENV_STRICT}=0."
        )


def _server_args_gate(original, self, *args, **kwargs):
    if _runtime is not None:
        startup_check(_runtime)
    return original(self, *args, **kwargs)


def _scheduler_gate(original, self, *args, **kwargs):
    if _runtime is not None:
        startup_check(_runtime)
    result = original(self, *args, **kwargs)
    if _runtime is not None:
        from sglang.srt.distributed.parallel_state import get_world_group

        digest = ranks.agree_on_slot_set(_runtime.state.applied(), get_world_group().cpu_group)
        logger.info("hostsync: slot-set digest %s agreed across ranks", digest)
    return result
