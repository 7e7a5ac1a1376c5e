"""The startup pipeline's one result: the selected slots, every slot's verdict and
reason, and how strictly a refusal is treated.

``resolve()`` computes it from the environment and the *upstream* objects (before
any of the plugin's hooks is registered). The launcher exports it to the processes
it spawns (``SGLANG_HOSTSYNC_PLAN``), which read it instead of computing their own
while their environment still matches; the doctor prints the same object.
Server arguments add one refinement: slots that would do nothing for them (an
upstream switch SGLang would not read, an owned slot whose hooks these arguments
never reach) are skipped. Given with the arguments (``resolve(facts=...)``, the
launcher's path), an inert slot's targets are not even checked, so neither the
launcher nor any scheduler imports or hooks them; ``with_facts`` applies the same
rules to a plan resolved before the arguments were known.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import checks, choice, config, registry, switches, version
from .slot import ENV_UNSAFE, ConfigPrecheck, ServingFacts, Slot, SlotKind, Status, TargetKind, inert_reason

# Internal: the launcher's plan, inherited by every process it spawns.
ENV_PLAN = "SGLANG_HOSTSYNC_PLAN"
NOT_PICKED = "not picked by auto"


class HostsyncStartupError(RuntimeError):
    pass


@dataclass(frozen=True)
class Verdict:
    name: str
    selected: bool
    status: Status
    reason: str = ""

    @property
    def bad_config(self) -> bool:
        """Bad input (the slot's own env value), not upstream drift."""
        return self.reason.startswith(config.BAD_CONFIGURATION)

    @property
    def left_out_by_auto(self) -> bool:
        """Named by the selection (``auto``'s union) but not by the pick."""
        return self.status is Status.SKIPPED and self.reason.startswith(NOT_PICKED)

    @property
    def input_caused(self) -> bool:
        """Refused for bad input: its own, or that of a slot it requires (directly or not)."""
        return self.reason.rpartition(checks.CANNOT_APPLY)[2].startswith(config.BAD_CONFIGURATION)


@dataclass(frozen=True)
class Plan:
    spec: str
    strict: bool
    sglang: str | None
    version_warning: str | None
    verdicts: tuple[Verdict, ...]  # every catalogue slot, in catalogue order
    inputs: str  # digest of what it was computed from (see ``inputs_digest``)
    facts: dict | None = None  # ServingFacts.record() of the server args applied, once applied
    choice: str | None = None  # ``auto``: what it picked and how to pin it (``choice.line``), once decided

    @property
    def facts_applied(self) -> bool:
        return self.facts is not None

    @property
    def selected(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.verdicts if v.selected)

    def verdict(self, name: str) -> Verdict:
        return next(v for v in self.verdicts if v.name == name)

    def refused(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.selected and v.status is Status.FAILED]

    def config_errors(self) -> list[str]:
        """Bad input of selected slots: stops argument preparation in every mode."""
        return [f"{v.name}: {v.reason[len(config.BAD_CONFIGURATION):]}" for v in self.refused() if v.bad_config]

    def warnings(self) -> list[str]:
        found = [self.version_warning] if self.version_warning else []
        return found + [f"{v.name}: {v.reason}" for v in self.verdicts
                        if (v.selected and v.reason.startswith("undone: ")) or ENV_UNSAFE in v.reason]

    @property
    def auto_pending(self) -> bool:
        """``auto`` whose pick the server facts have not decided yet."""
        return choice.is_auto(self.spec) and self.choice is None

    def settle_auto(self, catalogue: Mapping[str, Slot]) -> "Plan":
        """A pick still open where the plan must be final (a scheduler installing it): ``default`` with
        the user's other tokens, said so."""
        if not self.auto_pending:
            return self
        picked = choice.undecided()
        check_pick_env(picked, self.spec, set(self.selected), catalogue, switches.user_env())
        skips = left_out(picked, self.spec, set(self.selected), catalogue)
        verdicts = tuple(dataclasses.replace(v, status=Status.SKIPPED, reason=skips[v.name])
                         if v.name in skips and v.status is not Status.SKIPPED else v for v in self.verdicts)
        return dataclasses.replace(self, verdicts=refuse_claims(verdicts, catalogue), choice=choice.line(picked, self.spec))

    def waived_by_auto(self, names) -> set[str]:
        """Of ``names`` (slots that cannot apply), those that only ``auto``'s pick brought in: neither in
        ``default`` nor named by the user. They are switched off as a whole and reported, but never stop a
        strict startup: the user asked for the measured set that can run, not for them."""
        if not choice.is_auto(self.spec) or not names:
            return set()
        catalogue = registry.catalogue()
        named = [t.strip() for t in self.spec.split(",") if t.strip() and t.strip().lower() != choice.AUTO
                 and not t.strip().startswith("-")]
        kept = set(config.parse_slot_spec(choice.CONSERVATIVE, catalogue).names)
        kept |= set(config.parse_slot_spec(",".join(named), catalogue).names) if named else set()
        return set(names) - kept

    def check_startup(self) -> None:
        """Raise what the server must stop on: bad input always, a refused slot in strict mode
        (with ``auto`` once its pick is known: a slot it does not pick never stops startup)."""
        bad = self.config_errors()
        if bad:
            raise config.HostsyncConfigError("hostsync: " + "; ".join(bad))
        refused = [] if self.auto_pending else self.refused()
        refused = [v for v in refused if v.name not in self.waived_by_auto([v.name for v in refused])]
        if self.strict and refused:
            raise HostsyncStartupError(
                "hostsync: selected slots cannot be applied to this SGLang (strict mode): "
                + "; ".join(f"{v.name}: {v.reason}" for v in refused)
                + f". Deselect them with {config.ENV_SLOTS} or set {config.ENV_STRICT}=0."
            )

    def with_facts(self, catalogue: Mapping[str, Slot], facts: ServingFacts) -> "Plan":
        """Slots that would do nothing for these server args are skipped; the
        switches left say which flag they set. Applied once per launch, and again once SGLang
        has resolved values the facts held as unknown (None: a topk or page size the user left
        out, the attention backends): the plan is refined, never widened."""
        if self.facts_applied and not refines(self.facts, facts.record()):
            return self
        applying = {v.name for v in self.verdicts if v.status in (Status.WOULD_APPLY, Status.UPSTREAM)}
        selected = {v.name for v in self.verdicts if v.selected}
        picked = choice.pick(facts) if self.auto_pending else None
        if picked is not None:
            check_pick_env(picked, self.spec, selected, catalogue, switches.user_env())
        inert, skips = skip_reasons(catalogue, facts, self.spec, picked, selected, applying)
        line = picked and choice.line(picked, self.spec)
        verdicts = [dataclasses.replace(v, status=Status.SKIPPED, reason=inert[v.name])
                    if (v.status is Status.WOULD_APPLY or (v.status is Status.FAILED and v.name in skips))
                    and inert[v.name] else v for v in self.verdicts]
        pending = choice.is_auto(self.spec) and (line or self.choice) is None
        verdicts = refuse_unsafe_pairs(tuple(verdicts), catalogue, facts, pending)
        return dataclasses.replace(self, verdicts=verdicts if pending else refuse_claims(verdicts, catalogue),
                                   facts=facts.record(), choice=line or self.choice)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: str) -> "Plan":
        data = json.loads(raw)
        verdicts = tuple(Verdict(v["name"], v["selected"], Status(v["status"]), v["reason"]) for v in data.pop("verdicts"))
        return cls(verdicts=verdicts, **data)


def inert_reasons(catalogue: Mapping[str, Slot], facts: ServingFacts | None, selected: set[str],
                  candidates: set[str] | None = None) -> dict[str, str | None]:
    """Slot name -> why it would do nothing for these facts (None: it would act). A
    ``kept_by_dependents`` slot acts wherever a selected slot that requires it would act
    (of ``candidates``: those not refused yet; None: all)."""
    inert = {name: inert_reason(slot, facts) for name, slot in catalogue.items()}
    acting = {n for n in selected if inert[n] is None and (candidates is None or n in candidates)}
    for name, slot in catalogue.items():
        if slot.kept_by_dependents and inert[name] and any(name in catalogue[d].requires for d in acting):
            inert[name] = None
    return inert


def left_out(picked: choice.Choice, spec: str, selected: set[str], catalogue: Mapping[str, Slot]) -> dict[str, str]:
    """The selected slots an ``auto`` pick leaves out, name -> reason."""
    # What the pinning value selects (the pick with the user's other tokens): bad input raises here.
    keep = set(config.parse_slot_spec(choice.pinned(picked, spec), catalogue).names)
    why = f"{NOT_PICKED} for {picked.label} (it picks {picked.spec})"
    return {n: why for n in selected - keep}


def check_pick_env(picked: choice.Choice, spec: str, selected: set[str], catalogue: Mapping[str, Slot],
                   env: Mapping[str, str]) -> None:
    """The user's switch flags set against a slot ``auto`` keeps are bad input, once the pick is known
    (the union an open pick lists is not what runs: flags against its other slots are the user's call)."""
    keep = selected - set(left_out(picked, spec, selected, catalogue))
    switches.check_contrary_env([catalogue[n] for n in sorted(keep)], env)


def skip_reasons(catalogue: Mapping[str, Slot], facts: ServingFacts | None, spec: str, picked: choice.Choice | None,
                 selected: set[str], candidates: set[str] | None = None) -> tuple[dict[str, str | None], dict[str, str]]:
    """Every slot's reason to be skipped for these facts (inert, or left out by ``auto``'s pick; None:
    it would act), and the ones the pick left out."""
    skips = left_out(picked, spec, selected, catalogue) if picked else {}
    inert = inert_reasons(catalogue, facts, selected - set(skips), candidates)
    inert.update({n: inert[n] or why for n, why in skips.items()})
    return inert, skips


def refines(old: Mapping, new: Mapping) -> bool:
    """Whether the facts ``new`` only resolve values ``old`` held as unknown (None), and resolve
    at least one: the same server args, known better."""
    def known_better(o, n):
        if isinstance(o, list) and isinstance(n, list) and len(o) == len(n):
            return all(known_better(a, b) for a, b in zip(o, n))
        return o is None or o == n

    return set(old) == set(new) and old != new and all(known_better(old[k], new[k]) for k in old)


def refuse_unsafe_pairs(verdicts: tuple[Verdict, ...], catalogue: Mapping[str, Slot],
                        facts: ServingFacts, pending: bool = False) -> tuple[Verdict, ...]:
    """Refuse each selected slot that would apply beside a slot its ``unsafe_with`` names
    that would apply too (both known only once the server facts are: inert ones are
    skipped by then). With an EAGLE-family topk SGLang has not chosen yet, the pair waits
    for the plan's refinement (topk 1 makes the tree slots inert), as does an ``auto`` selection
    the facts do not decide yet (``pending``: its pick holds no such pair)."""
    if facts.topk is None or pending:
        return verdicts
    applying = {v.name for v in verdicts if v.selected and v.status in (Status.WOULD_APPLY, Status.UPSTREAM)}
    out = []
    for v in verdicts:
        clash = next(((o, why) for o, why in catalogue[v.name].unsafe_with if o in applying), None)
        if v.name in applying and clash is not None:
            # Bad input: the selection must change, so it stops startup in every mode.
            v = dataclasses.replace(v, status=Status.FAILED, reason=(
                f"{config.BAD_CONFIGURATION}cannot run beside slot {clash[0]!r} for these server arguments: "
                f"{clash[1]}; deselect one"))
        out.append(v)
    return tuple(out)


def inputs_digest(env: Mapping[str, str], catalogue: Mapping[str, Slot], sglang: str | None) -> str:
    """What a plan depends on: the plugin's own env settings, the SGLang version and
    the catalogue. (SGLang's switch flags are left out: the launcher sets them.)"""
    own = sorted((k, v) for k, v in env.items()
                 if (k.startswith("SGLANG_HOSTSYNC_") and k != ENV_PLAN) or k == config.ENV_ENABLE)
    body = json.dumps([own, sglang, [(n, s.provider) for n, s in catalogue.items()]])
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def _verdict(slot: Slot, selected: bool, reason: str | None, env: Mapping[str, str]) -> Verdict:
    if reason:
        return Verdict(slot.name, selected, Status.FAILED, reason)
    status = Status.UPSTREAM if slot.kind is SlotKind.UPSTREAM_BUILTIN else Status.WOULD_APPLY
    warning = slot.env_warning(env) if slot.env_warning else None
    if warning:
        return Verdict(slot.name, selected, status, f"undone: {warning}")
    if slot.kind is SlotKind.UPSTREAM_SWITCH:
        return Verdict(slot.name, selected, status, f"sets {slot.env_flag}=1")
    return Verdict(slot.name, selected, status)


def _check(slot: Slot, inert: str | None) -> str | None:
    """The slot's checks; for an inert slot only its own env settings (bad input stays an
    error), never its targets."""
    if inert is None:
        return checks.check_slot(slot)
    return slot.precheck.config() if isinstance(slot.precheck, ConfigPrecheck) else None


def resolve(env: Mapping[str, str] | None = None, facts: ServingFacts | None = None) -> Plan:
    """Parse the environment and check every slot (with ``facts``: every slot not inert
    for them). Raises HostsyncConfigError on bad input (switch values, slot list, SGLang
    version) and SlotRegistryError."""
    env = os.environ if env is None else env
    installed = version.installed_sglang()
    version_warning = version.check_sglang_version(installed, env)
    strict = config.strict_mode(env)
    catalogue = registry.catalogue()
    selection = config.selected_slots(catalogue, env)
    chosen = set(selection.names)
    picked = choice.pick(facts) if selection.auto else None
    if selection.auto:
        # Every pick holds the fallback's slots: user tokens bad beside it are bad beside any pick, so they
        # stop the launcher here, not a scheduler that settles an open pick (``Plan.settle_auto``).
        left_out(choice.undecided(), selection.spec, chosen, catalogue)
        if picked is not None:
            check_pick_env(picked, selection.spec, chosen, catalogue, env)
    else:
        switches.check_contrary_env([catalogue[n] for n in selection.names], env)
    inert, _ = skip_reasons(catalogue, facts, selection.spec, picked, chosen)
    line = picked and choice.line(picked, selection.spec)
    reasons = {name: _check(slot, inert[name]) for name, slot in catalogue.items()}
    # Two selected slots on one target are both refused before anything is registered.
    passed = [catalogue[n] for n in selection.names if reasons[n] is None and inert[n] is None]
    reasons.update(claim_conflicts(passed, selection.spec, catalogue, open_pick=selection.auto and picked is None))
    reasons.update(checks.refused_dependents(catalogue, reasons))
    verdicts = tuple(Verdict(name, name in chosen, Status.SKIPPED, inert[name]) if inert[name] and not reasons[name]
                     else _verdict(slot, name in chosen, reasons[name], env) for name, slot in catalogue.items())
    if facts is not None:
        verdicts = refuse_unsafe_pairs(verdicts, catalogue, facts, selection.auto and line is None)
    return Plan(spec=selection.spec, strict=strict, sglang=installed, version_warning=version_warning,
                verdicts=verdicts, inputs=inputs_digest(env, catalogue, installed),
                facts=facts.record() if facts is not None else None, choice=line)


def claim_conflicts(passed: list[Slot], spec: str, catalogue: Mapping[str, Slot], open_pick: bool) -> dict[str, str]:
    """``checks.claim_conflicts`` over the slots that may run together. While an ``auto`` pick is open
    (``open_pick``) that is each row's own set and the fallback with the user's tokens, not their union:
    the pick runs one row, and plain function hooks from different rows are installed behind their gates
    (``installer.compose_function``) until the facts choose (``refuse_claims`` then checks the acting set).
    Edit sites and class overrides compose with nothing else, so their claims count over the union."""
    if not open_pick:
        return checks.claim_conflicts(passed)
    refused: dict[str, str] = {}
    for picked in (*(set(config.parse_slot_spec(row.choice.spec, catalogue).names) for row in choice.ROWS),
                   set(config.parse_slot_spec(choice.pinned(choice.undecided(), spec), catalogue).names)):
        for name, why in checks.claim_conflicts([s for s in passed if s.name in picked]).items():
            refused.setdefault(name, why)
    fixed = [dataclasses.replace(s, targets=tuple(t for t in s.targets if t.kind is TargetKind.CLASS or t.site))
             for s in passed]
    for name, why in checks.claim_conflicts(fixed).items():
        refused.setdefault(name, why)
    return refused


def refuse_claims(verdicts: tuple[Verdict, ...], catalogue: Mapping[str, Slot]) -> tuple[Verdict, ...]:
    """Once the facts chose (or ``settle_auto`` fixed) the pick: two acting slots on one target are both
    refused, as ``resolve`` refuses them in a plan made with the facts."""
    acting = [catalogue[v.name] for v in verdicts if v.selected and v.status is Status.WOULD_APPLY]
    refused = checks.claim_conflicts(acting)
    return tuple(dataclasses.replace(v, status=Status.FAILED, reason=refused[v.name]) if v.name in refused else v
                 for v in verdicts)


def inherited(env: Mapping[str, str] | None = None) -> Plan | None:
    """The launcher's plan, when this process's environment still matches it."""
    env = os.environ if env is None else env
    raw = env.get(ENV_PLAN)
    if not raw:
        return None
    try:
        plan = Plan.from_json(raw)
    except (ValueError, KeyError, TypeError):
        return None
    catalogue = registry.catalogue()
    if plan.inputs != inputs_digest(env, catalogue, version.installed_sglang()):
        return None
    if [v.name for v in plan.verdicts] != list(catalogue):
        return None
    return plan


def export(plan: Plan, env=None) -> None:
    """Hand the plan to every process spawned from here."""
    (os.environ if env is None else env)[ENV_PLAN] = plan.to_json()
