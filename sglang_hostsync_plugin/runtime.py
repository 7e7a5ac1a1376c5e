"""Per-process lifecycle of the enabled plugin.

``activate()`` runs inside SGLang's ``load_plugins()`` (so it must not raise: the
loader only logs). It records any configuration error and installs the selected
slots. ``startup_check()`` runs from the first hook SGLang calls after loading
(``engine._set_envs_and_config`` in the launcher process, which every launch path
and an embedded ``Engine`` call before spawning; ``Scheduler.__init__`` in every
scheduler/TP process): it raises the recorded error, turns on the upstream
switches for these server args, verifies the hooks, logs the status block and,
after the scheduler has built its process groups, agrees on the slot set with
every other rank.
"""

from __future__ import annotations

import logging
import os

import time

from . import config, csrc, installer, ranks, registry, report, switches, version
from .slot import ServingFacts

logger = logging.getLogger("sglang.srt.plugins.hostsync")

# The launcher's "set global environments" step, after the args are resolved and
# before any process is spawned. (ServerArgs.__post_init__ is not hookable: msgspec
# binds it when the class is created.)
LAUNCHER_SET_ENVS = "sglang.srt.entrypoints.engine._set_envs_and_config"
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
        self.switches_applied = False


_runtime: Runtime | None = None


def current() -> Runtime | None:
    return _runtime


def _hook_registry_register(path: str, hook, kind: str) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(path, hook, HookType.AROUND if kind == "around" else HookType.REPLACE)


def _selected(selection: config.Selection):
    catalogue = registry.catalogue()
    return [catalogue[n] for n in selection.names]


def _log_env_warnings(slots) -> None:
    for slot in slots:
        warning = slot.env_warning(os.environ) if slot.env_warning else None
        if warning:
            logger.warning("hostsync: %s: %s", slot.name, warning)


def validate(server_args=None) -> config.Selection:
    """Everything the launcher checks before any model load; raises on bad input.

    With ``server_args``, also turns on the selected upstream switches' env flags
    here, before any process is spawned."""
    rt = _runtime
    strict = config.strict_mode()  # raises on a malformed value
    if rt is not None:
        # load_plugins() already activated the plugin in this process (the env switch
        # was set before launch): its verdicts were computed on the upstream objects,
        # before any hook was registered. The live objects are now the plugin's own.
        if rt.error is not None:
            raise rt.error
        selection = rt.selection
        refused = [(s.name, s.reason) for s in rt.state.failed()]
    else:
        version.check_sglang_version()
        catalogue = registry.catalogue()
        selection = config.selected_slots(catalogue)
        switches.check_contrary_env(_selected(selection), os.environ)
        rows = report.doctor_rows({n: catalogue[n] for n in selection.names})
        refused = [(r.name, r.reason) for r in rows if not report.rows_ok([r])]
    bad = config.config_errors(refused)
    if bad:  # bad input fails argument preparation in every mode
        raise config.HostsyncConfigError("hostsync: " + "; ".join(bad))
    if strict and refused:
        raise HostsyncStartupError(
            "hostsync: selected slots cannot be applied to this SGLang (strict mode): "
            + "; ".join(f"{name}: {reason}" for name, reason in refused)
        )
    if server_args is not None:
        facts = ServingFacts.from_server_args(server_args, os.environ)
        for name, inert in switches.apply(_selected(selection), facts).items():
            if inert:
                logger.info("hostsync: %s skipped: %s", name, inert)
        refused_names = {name for name, _ in refused}
        csrc.start_prebuild(kernels_for([s for s in _selected(selection) if s.name not in refused_names], facts))
    if rt is None:  # activate() already logged them in this process
        _log_env_warnings(_selected(selection))
    return selection


def kernels_for(slots, facts: ServingFacts) -> tuple[str, ...]:
    """The csrc kernels ``slots`` will load for these server args, in order, once each."""
    names: list[str] = []
    for slot in slots:
        for name in slot.kernels(facts) if slot.kernels else ():
            if name not in names:
                names.append(name)
    return tuple(names)


def prepare_slots(rt: Runtime, server_args) -> None:
    """Each applied slot's ``prepare`` (kernel loads) before the scheduler is ready."""
    facts = ServingFacts.from_server_args(server_args, os.environ)
    catalogue = registry.catalogue()
    for name in rt.state.applied():
        slot = catalogue[name]
        if slot.prepare is None:
            continue
        t0 = time.perf_counter()
        try:
            note = slot.prepare(facts)
        except Exception as exc:
            raise HostsyncStartupError(f"hostsync: {name}: preparing failed: {exc}") from exc
        if note:
            logger.info("hostsync: %s prepared in %.1f s: %s", name, time.perf_counter() - t0, note)


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
        switches.check_contrary_env(_selected(rt.selection), os.environ)
    except (config.HostsyncConfigError, registry.SlotRegistryError) as exc:
        rt.error = exc
        logger.error("hostsync: %s", exc)
    else:
        try:
            installer.install(
                rt.state, [catalogue[n] for n in rt.selection.names], _hook_registry_register
            )
        except Exception as exc:  # an installer bug must stop startup loudly, not half-apply
            rt.error = HostsyncStartupError(f"hostsync: installing the slots failed: {type(exc).__name__}: {exc}")
            rt.state.active.clear()
            logger.error("%s", rt.error)
        installer.mark_unselected(rt.state, catalogue, rt.selection.names)
        _log_env_warnings(_selected(rt.selection))
        _note_env_warnings(rt)
    _hook_registry_register(LAUNCHER_SET_ENVS, _launcher_gate, "around")
    _hook_registry_register(SCHEDULER_INIT, _scheduler_gate, "around")
    return rt


def _note_env_warnings(rt: Runtime) -> None:
    for slot in _selected(rt.selection):
        status = rt.state.statuses.get(slot.name)
        warning = slot.env_warning(os.environ) if slot.env_warning else None
        if warning and status is not None and status.state == installer.UPSTREAM:
            status.reason = f"undone: {warning}"


def apply_switches(rt: Runtime, server_args) -> None:
    """Turn on the selected, applicable upstream switches in this process (once,
    before SGLang's workers read them); an inert one is reported skipped."""
    if rt.switches_applied or rt.error is not None or rt.selection is None:
        return
    rt.switches_applied = True
    facts = ServingFacts.from_server_args(server_args, os.environ)
    selected = [s for s in _selected(rt.selection) if s.name in rt.state.active]
    for name, inert in switches.apply(selected, facts).items():
        status = rt.state.statuses[name]
        if inert:
            rt.state.active.discard(name)
            rt.state.statuses[name] = installer.SlotStatus(name, installer.SKIPPED, inert)
        else:
            status.reason = f"{registry.catalogue()[name].env_flag}=1"


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


def _launcher_gate(original, server_args, *args, **kwargs):
    if _runtime is not None and _runtime.error is not None:
        raise _runtime.error
    result = original(server_args, *args, **kwargs)
    if _runtime is not None:
        apply_switches(_runtime, server_args)
        startup_check(_runtime)
        facts = ServingFacts.from_server_args(server_args, os.environ)
        csrc.start_prebuild(kernels_for([registry.catalogue()[n] for n in _runtime.state.applied()], facts))
    return result


def _scheduler_gate(original, self, *args, **kwargs):
    if _runtime is not None:
        if _runtime.error is None:
            server_args = kwargs["server_args"] if "server_args" in kwargs else args[0]
            apply_switches(_runtime, server_args)
        startup_check(_runtime)
    result = original(self, *args, **kwargs)
    if _runtime is not None:
        from sglang.srt.distributed.parallel_state import get_world_group

        digest = ranks.agree_on_slot_set(_runtime.state.applied(), get_world_group().cpu_group)
        logger.info("hostsync: slot-set digest %s agreed across ranks", digest)
        prepare_slots(_runtime, kwargs["server_args"] if "server_args" in kwargs else args[0])
    return result
