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

SGLang's launcher never runs a scheduler in its own process (it spawns them), so where
``load_plugins()`` is called from a launcher entry point without an exported plan,
``defer()`` registers only the launcher gate: the plan is resolved once the server args
are known (``validate``), checking only the slots these args reach, and the slots' hooks
are registered in the scheduler processes, which read that plan. SGLang's other processes are
told by the function that called ``load_plugins()`` (``process_role``): a scheduler needs no CLI
shim or launcher gate; the detokenizer and the DP controller run no slot code and hook nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from . import config, csrc, installer, plan as plans, ranks, registry, report, switches
from .plan import HostsyncStartupError, Plan
from .slot import ServingFacts, Status

logger = logging.getLogger("sglang.srt.plugins.hostsync")

# The launcher's "set global environments" step, after the args are resolved and
# before any process is spawned. (ServerArgs.__post_init__ is not hookable: msgspec
# binds it when the class is created.)
LAUNCHER_SET_ENVS = "sglang.srt.entrypoints.engine._set_envs_and_config"
SCHEDULER_INIT = "sglang.srt.managers.scheduler.Scheduler.__init__"

__all__ = ["HostsyncStartupError", "activate", "current", "validate", "startup_check"]


class Runtime:
    def __init__(self):
        self.error: Exception | None = None
        self.state = installer.InstallState()
        self.plan: Plan | None = None
        self.reported = False
        self.setup_s: float | None = None  # activate(): plan (checks import the targets) + hook registration
        self.plan_inherited = False
        self.args = None  # the server args object the plan's facts were applied for (None: not yet)


_runtime: Runtime | None = None
_deferred = False  # load_plugins() ran in a launcher: the plan waits for the server args
_plan_args = None  # the server args object this process last resolved and exported a plan for
_plan_env: dict | None = None  # this process's environment after SGLang set up for _plan_args (plan left out)
plan_resolved_s: float | None = None  # the last ``validate`` that resolved a plan here (its log line)

# The files of SGLang's launcher entry points that call load_plugins(): ``python -m
# sglang.launch_server``, ``sglang serve`` and the embedded ``Engine``. Schedulers are
# spawned (engine.py forces "spawn"), so none of these is on a scheduler's stack.
LAUNCHER_FILES = ("sglang/launch_server.py", "sglang/cli/serve.py", "sglang/srt/entrypoints/engine.py")


def current() -> Runtime | None:
    return _runtime


def _hook_registry_register(path: str, hook, kind: str) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(path, hook, HookType.AROUND if kind == "around" else HookType.REPLACE)


def _log_warnings(plan: Plan) -> None:
    for warning in plan.warnings()[1 if plan.version_warning else 0:]:  # version: logged by its check
        logger.warning("hostsync: %s", warning)


def _log_choice(before: Plan | None, after: Plan) -> None:
    if after.choice and (before is None or after.choice != before.choice):
        logger.info("hostsync: %s", after.choice)


def _log_new_warnings(before: Plan, after: Plan) -> None:
    """The warnings the server facts revealed (e.g. a user's own flag where its slot is unsafe)."""
    seen = set(before.warnings())
    for warning in after.warnings():
        if warning not in seen:
            logger.warning("hostsync: %s", warning)


# SGLang's process functions that call load_plugins(), by (file, function). Schedulers run the
# slots; the detokenizer and the DP controller (its schedulers are spawned) run no slot code.
PROCESS_CALLERS = {
    ("sglang/srt/managers/scheduler.py", "run_scheduler_process"): "scheduler",
    ("sglang/srt/managers/detokenizer_manager.py", "run_detokenizer_process"): "detokenizer",
    ("sglang/srt/managers/data_parallel_controller.py", "run_data_parallel_controller_process"): "dp_controller",
}
NO_SLOT_ROLES = ("detokenizer", "dp_controller")
LOAD_PLUGINS_FILE = "sglang/srt/plugins/__init__.py"


def _file(frame) -> str:
    return frame.f_code.co_filename.replace(os.sep, "/")


def called_from_launcher(frame=None) -> bool:
    """Whether a frame of SGLang's launcher entry points is on this stack (from ``frame``
    up; default: the caller's)."""
    f = sys._getframe(1) if frame is None else frame
    while f is not None:
        if _file(f).endswith(LAUNCHER_FILES):
            return True
        f = f.f_back
    return False


def process_role(frame=None) -> str | None:
    """The role of the SGLang process function that called ``load_plugins()`` (``PROCESS_CALLERS``),
    else None. Only the direct caller counts: a forked child keeps its parent's frames."""
    f = sys._getframe(1) if frame is None else frame
    while f is not None and not (f.f_code.co_name == "load_plugins" and _file(f).endswith(LOAD_PLUGINS_FILE)):
        f = f.f_back
    caller = f.f_back if f is not None else None
    if caller is None:
        return None
    return next((role for (path, fn), role in PROCESS_CALLERS.items()
                 if caller.f_code.co_name == fn and _file(caller).endswith(path)), None)


def process_roles_found() -> dict[str, bool]:
    """Per role: whether the installed SGLang's process function still calls ``load_plugins()``
    (where not, that process takes the path of any other: it registers what a scheduler would)."""
    import importlib

    found = {}
    for (path, fn), role in PROCESS_CALLERS.items():
        try:
            func = getattr(importlib.import_module(path[:-len(".py")].replace("/", ".")), fn)
            found[role] = "load_plugins" in func.__code__.co_names
        except Exception:  # a moved module or function: that role is not recognised
            found[role] = False
    return found


def launcher_defers() -> bool:
    """In a launcher nothing is hooked at load_plugins() time: it resolves its own plan. A plan already
    in its environment was exported by another launch (a parent process's, for its own server args):
    it is dropped here, before anything reads it."""
    if not called_from_launcher():
        return False
    if os.environ.pop(plans.ENV_PLAN, None) is not None:
        logger.info("hostsync: dropped the plan another launch exported into this environment; this launch "
                    "makes its own")
    return True


def defer() -> None:
    """The launcher's part at load_plugins(): its gate only; ``validate`` resolves the plan
    with the server args (``prepare_server_args`` or, for an embedded Engine, the gate)."""
    global _deferred
    _deferred = True
    register_launcher_gate()


def validate(server_args=None) -> Plan:
    """Everything the launcher checks before any model load; raises on bad input.

    With ``server_args``: skips the slots that would be inert (without checking their
    targets), turns on the remaining switches' env flags, exports the plan to the processes spawned from here and
    starts building the kernels they will load."""
    global _plan_args, _plan_env, plan_resolved_s
    rt = _runtime
    # The user's environment: not the flags an earlier (still open) plan of this process turned on.
    facts = ServingFacts.from_server_args(server_args, switches.user_env()) if server_args is not None else None
    if rt is not None:
        # load_plugins() already activated the plugin in this process (the env switch
        # was set before launch): its plan was resolved on the upstream objects,
        # before any hook was registered. The live objects are now the plugin's own.
        if rt.error is not None:
            raise rt.error
        plan = rt.plan
    else:
        # With the server args known, slots inert for them are never checked (or imported).
        t0 = time.perf_counter()
        switches.clear_own()
        plan = plans.resolve(facts=facts)
        _log_warnings(plan)
        plan_resolved_s = time.perf_counter() - t0
        logger.info("hostsync: plan resolved in %.2f s in this process (%s: targets imported and checked)",
                    plan_resolved_s, "every slot" if facts is None else "the slots these server args reach")
    plan.check_startup()
    if server_args is not None:
        if rt is not None:
            apply_facts(rt, server_args)
            plan = rt.plan
        else:
            before, plan = plan, plan.with_facts(registry.catalogue(), facts)
            _log_new_warnings(before, plan)
            _log_choice(None, plan)
        plan.check_startup()  # the facts can refuse a slot (Slot.unsafe_with)
        if rt is None:
            _set_switch_flags(plan)
        plans.export(plan)
        _plan_args, _plan_env = server_args, None
        _prebuild(plan, facts)
    return plan


def _prebuild(plan: Plan, facts: ServingFacts) -> None:
    """Build the kernels the plan's slots will load; an ``auto`` pick still open waits (its union
    names slots the pick may leave out)."""
    if not plan.auto_pending:
        csrc.start_prebuild(kernels_for(_will_apply(plan), facts))


def _will_apply(plan: Plan):
    catalogue = registry.catalogue()
    return [catalogue[v.name] for v in plan.verdicts if v.selected and v.status is Status.WOULD_APPLY]


def _set_switch_flags(plan: Plan) -> None:
    for v in plan.verdicts:
        if v.selected and v.status is Status.SKIPPED:
            logger.info("hostsync: %s skipped: %s", v.name, v.reason)
    if not plan.auto_pending:  # an open pick lists every row's switches, some unsafe together: none yet
        switches.apply(_will_apply(plan))


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


def activate(error: Exception | None = None, launcher_gate: bool = True) -> Runtime:
    """Install the selected slots in this process; with ``error``, only the gates
    that will raise it at startup. A scheduler process needs no launcher gate."""
    global _runtime
    t0 = time.perf_counter()
    rt = Runtime()
    _runtime = rt
    try:
        if error is not None:
            raise error
        inherited = plans.inherited()
        rt.plan_inherited = inherited is not None
        rt.plan = inherited or plans.resolve()
    except (config.HostsyncConfigError, registry.SlotRegistryError) as exc:
        rt.error = exc
        logger.error("hostsync: %s", exc)
    else:
        if inherited is None:
            _log_warnings(rt.plan)
        try:
            installer.install(rt.state, rt.plan, registry.catalogue(), _hook_registry_register)
        except Exception as exc:  # an installer bug must stop startup loudly, not half-apply
            rt.error = HostsyncStartupError(f"hostsync: installing the slots failed: {type(exc).__name__}: {exc}")
            rt.state.active.clear()
            logger.error("%s", rt.error)
    if launcher_gate:
        register_launcher_gate()
    _hook_registry_register(SCHEDULER_INIT, _scheduler_gate, "around")
    rt.setup_s = time.perf_counter() - t0
    return rt


def register_launcher_gate() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    if not any(h is launcher_gate for _, h, _ in HookRegistry._hooks.get(LAUNCHER_SET_ENVS, ())):
        _hook_registry_register(LAUNCHER_SET_ENVS, launcher_gate, "around")


def apply_facts(rt: Runtime, server_args) -> None:
    """Skip the selected slots that are inert for these server args and turn on the
    remaining switches' flags in this process (once, before SGLang's workers read them)."""
    if rt.error is not None or rt.plan is None:
        return
    if rt.args is not None:
        # Another args object: a second Engine of a process that set the plugin up itself.
        if server_args is not rt.args and rt.plan.facts is not None:
            now = ServingFacts.from_server_args(server_args, os.environ)
            if not now.matches(rt.plan.facts):
                record = now.record()
                diff = ", ".join(f"{k}: {v!r} -> {record.get(k)!r}" for k, v in rt.plan.facts.items()
                                 if v != record.get(k))
                raise HostsyncStartupError(
                    f"hostsync: this process's plan was made for other server arguments ({diff}); a process "
                    "that set the plugin up for one Engine starts an Engine with other arguments only in a new process")
        return
    rt.args = server_args
    before = rt.plan
    rt.plan = rt.plan.with_facts(registry.catalogue(), ServingFacts.from_server_args(server_args, os.environ))
    _settle(rt, before)
    for slot in switches.switch_slots(_will_apply(rt.plan)):
        if slot.name in rt.state.active:
            switches.apply([slot])
            rt.state.set(slot.name, rt.state.statuses[slot.name].status, f"{slot.env_flag}=1")


def _settle(rt: Runtime, before: Plan) -> None:
    """Hooks are installed: the ``auto`` pick becomes final (``default`` where still open), and the
    state follows the plan (a slot skipped now is switched off; one that failed to install but is
    not picked is skipped, not failed)."""
    rt.plan = rt.plan.settle_auto(registry.catalogue())
    _log_new_warnings(before, rt.plan)
    _log_choice(before, rt.plan)
    for v in rt.plan.verdicts:
        now = rt.state.statuses.get(v.name)
        if v.selected and v.status in (Status.SKIPPED, Status.FAILED) and v.name in rt.state.active:
            rt.state.set(v.name, v.status, v.reason)
        elif v.selected and v.status is Status.SKIPPED and now is not None and now.status is Status.FAILED:
            rt.state.set(v.name, v.status, v.reason)  # failed, but ``auto`` did not pick it


def startup_check(rt: Runtime) -> None:
    if rt.error is not None:
        raise rt.error
    if rt.plan is not None and rt.plan.auto_pending:  # no server args reached this process's plan
        _settle(rt, rt.plan)
    bad = rt.plan.config_errors() if rt.plan is not None else []
    if bad:  # e.g. a pair the server facts made unsafe (Slot.unsafe_with): every mode
        raise config.HostsyncConfigError("hostsync: " + "; ".join(bad))
    if not rt.state.verified:
        installer.verify(rt.state, registry.catalogue())
    if not rt.reported:
        rt.reported = True
        from . import version

        spec = rt.plan.spec if rt.plan else "?"
        # A failed slot in lenient mode must be visible at default log levels.
        logger.log(
            logging.WARNING if rt.state.failed() else logging.INFO,
            report.format_status_block(
                rt.state.statuses.values(),
                f"hostsync: sglang {version.installed_sglang()}, "
                f"{config.ENV_SLOTS}={spec!r}, strict={rt.plan.strict if rt.plan else '?'}"
                + (f"\n  {rt.plan.choice}" if rt.plan and rt.plan.choice else ""),
            )
        )
        if rt.setup_s is not None:
            logger.info("hostsync: set up in %.2f s in this process (%s, hooks registered)", rt.setup_s,
                        "the launcher's plan" if rt.plan_inherited else "plan resolved: targets imported and checked")
    failed = rt.state.failed()
    if rt.plan is not None:  # slots only auto's pick brought in are reported failed, never stop startup
        waived = rt.plan.waived_by_auto([s.name for s in failed])
        failed = [s for s in failed if s.name not in waived]
    if failed and rt.plan is not None and rt.plan.strict:
        raise HostsyncStartupError(
            "hostsync: slot(s) failed in strict mode: "
            + "; ".join(f"{s.name}: {s.reason}" for s in failed)
            + f". Deselect them with {config.ENV_SLOTS} or set {config.ENV_STRICT}=0."
        )


LATE_ENABLE = (
    "hostsync: %s was set after load_plugins() ran in this process, so nothing is hooked "
    "in it; the plugin is checked here and runs in the scheduler processes started from "
    "here. Set it before sglang loads its plugins to hook this process too."
)


def launcher_gate(original, server_args, *args, **kwargs):
    """Around ``_set_envs_and_config``, registered even while the plugin is disabled:
    an embedded Engine enabled after load_plugins() is still validated, and says so."""
    global _plan_env
    rt = _runtime
    if rt is not None and rt.error is not None:
        raise rt.error
    # Enabled, not active here, and no plan exported for these args and this environment: the switch
    # came after load_plugins(), or an embedded Engine (the CLI flag path exports one in
    # prepare_server_args for this very args object).
    if rt is None and config.plugin_enabled() and _needs_plan(server_args):
        if not _deferred:
            logger.warning(LATE_ENABLE, config.ENV_ENABLE)
        validate(server_args)
    elif rt is None and server_args is _plan_args:
        refine_exported(server_args)
    if rt is not None:
        apply_facts(rt, server_args)  # before SGLang's set-up: it raises for args other than this plan's
    result = original(server_args, *args, **kwargs)
    if rt is None and _plan_args is not None:
        _plan_env = _env_now()
    if rt is not None:
        startup_check(rt)
        facts = ServingFacts.from_server_args(server_args, os.environ)
        plans.export(rt.plan)
        csrc.start_prebuild(kernels_for([registry.catalogue()[n] for n in rt.state.applied()], facts))
    return result


def refine_exported(server_args) -> Plan | None:
    """The launcher made its plan in ``prepare_server_args``, before SGLang resolved the args;
    here (they are resolved, no scheduler is spawned yet) the plan learns what resolution
    decided: a topk or page size the user left out, the attention backends. Slots inert for
    those are skipped, their switch flags cleared, a pair they make unsafe refused; the
    refined plan is exported. Where resolution changed a value the plan had as known (SGLang
    overriding an argument), the plan is resolved again for the resolved args. Returns the
    new plan, or None when nothing changed."""
    exported = plans.inherited()
    if exported is None or not exported.facts_applied:
        return None
    # The flags the first plan set here are the plugin's, not the user's (e.g. every switch auto may pick).
    facts = ServingFacts.from_server_args(server_args, switches.user_env())
    if facts.record() == exported.facts:
        if not exported.auto_pending:
            return None
        refined = exported  # SGLang's resolution left auto's class open: it settles below
    else:
        refined = exported.with_facts(registry.catalogue(), facts)
        if refined is exported:
            logger.info("hostsync: SGLang's resolution changed server facts the plan was made with; resolving it again")
            return validate(server_args)
    # The schedulers must get a final pick (and its switch flags, set here before they are spawned).
    refined = refined.settle_auto(registry.catalogue())
    refined.check_startup()  # bad input the resolved facts reveal (Slot.unsafe_with), before any model load
    _log_new_warnings(exported, refined)
    _log_choice(exported, refined)
    now_skipped = [v.name for v, old in zip(refined.verdicts, exported.verdicts)
                   if v.selected and v.status is not old.status]
    switches.clear_own()
    switches.apply(_will_apply(refined))
    plans.export(refined)
    _prebuild(refined, facts)
    logger.info("hostsync: plan refined with SGLang's resolved arguments (%s); %s",
                ", ".join(f"{k}: {exported.facts[k]!r} -> {v!r}" for k, v in refined.facts.items()
                          if v != exported.facts[k]),
                "newly skipped: " + ", ".join(now_skipped) if now_skipped else "no verdict changed")
    return refined


def _env_now() -> dict:
    return {k: v for k, v in os.environ.items() if k != plans.ENV_PLAN}


def _needs_plan(server_args) -> bool:
    """Whether the launcher gate resolves a plan for ``server_args``: none exported for this environment,
    or this process exported one for another args object (a second Engine) whose facts or environment
    differ. The same facts and environment give the same verdicts, so that plan stays."""
    exported = plans.inherited()
    if exported is None:
        return True
    if _plan_args is None or server_args is _plan_args:
        return False
    if _env_now() != _plan_env or exported.facts != ServingFacts.from_server_args(server_args, os.environ).record():
        return True
    logger.info("hostsync: the plan exported for this process's last Engine stays: the same server facts and environment")
    return False


def _scheduler_gate(original, self, *args, **kwargs):
    server_args = kwargs["server_args"] if "server_args" in kwargs else args[0]
    if _runtime is not None:
        apply_facts(_runtime, server_args)
        startup_check(_runtime)
    result = original(self, *args, **kwargs)
    if _runtime is not None:
        from sglang.srt.distributed.parallel_state import get_world_group

        digest = ranks.agree_on_slot_set(_runtime.state.applied(), get_world_group().cpu_group)
        logger.info("hostsync: slot-set digest %s agreed across ranks", digest)
        prepare_slots(_runtime, server_args)
    return result
