"""``python -m sglang_hostsync_plugin doctor``: the slot table against the installed
SGLang, no GPU needed. Exit 0 when every slot is consistent with it, 1 on drift,
2 when the configuration itself is bad (unsupported SGLang, bad slot list, an env
flag set against a selected slot, an unknown attention backend).

It also says whether SGLang's scheduler, detokenizer and DP controller process functions still
call ``load_plugins()`` themselves (how the plugin tells those processes apart; not drift).

Given server arguments (``--speculative-algorithm``, ``--attention-backend``, ...),
it also says which slots would be inert for them (not checked, as in the launcher), and which attention
backend makes FutureMap do its per-step seq_lens D2H.

It imports neither torch, triton nor SGLang before it has checked that they are there: the
plugin's own requirements leave them out (SGLang's tree is GPU-sized), so a fresh environment
has none, and the doctor says so (exit 2) instead of failing at import."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import warnings

from . import backends, choice, config, plan as plans, registry, report, version
from .slot import ServingFacts, Status, inert_reason
from .slots import audit, audit_block, audit_ngram
from .slots.upstream_host_plans import FLASHINFER_PRESET
from .slots.upstream_switches import NGRAM_PRESET


# What the slot checks import. None is in the plugin's install requirements: SGLang brings torch
# and triton (SGLang 0.5.23 pins torch 2.14.1).
HOST_MODULES = ("torch", "triton", "sglang")


def missing_modules(names: tuple[str, ...] = HOST_MODULES) -> list[str]:
    """The top-level modules of ``names`` this interpreter cannot import (found without importing them)."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # ValueError: a None or spec-less entry in sys.modules
            found = False
        if not found:
            missing.append(name)
    return missing


def missing_message(missing: list[str], why: str = "the doctor checks every slot against SGLang") -> str:
    return (f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed in this Python "
            f"({sys.executable}); {why}: pip install sglang=={version.SUPPORTED_SGLANG} (it brings torch and triton)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-hostsync")
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="check every slot against the installed sglang")
    pre = sub.add_parser("prebuild", help="build the csrc kernels into torch's extension cache (for images)")
    pre.add_argument("kernels", nargs="*", help="default: all (eagle_tail, h2d_stage)")
    sub.add_parser("e2e", help="stock vs plugin in real servers (python -m sglang_hostsync_plugin.e2e --help)")
    doc.add_argument("--json", action="store_true", help="print one JSON object")
    doc.add_argument("--wide", action="store_true",
                     help=f"every column (kind, origin, default too), nothing wrapped; by default the output "
                          f"fits {report.DOCTOR_WIDTH} columns")
    srv = doc.add_argument_group("server arguments (as for sglang serve)")
    srv.add_argument("--speculative-algorithm", default=None)
    srv.add_argument("--attention-backend", default=None)
    srv.add_argument("--prefill-attention-backend", default=None)
    srv.add_argument("--decode-attention-backend", default=None)
    srv.add_argument("--speculative-draft-attention-backend", default=None)
    srv.add_argument("--speculative-attention-mode", default="prefill", choices=("prefill", "decode"))
    # Left out: SGLang chooses them in its own resolution (topk 4 for EAGLE on a Llama target);
    # unknown here, as in the launcher's first plan, so no slot is skipped for them.
    srv.add_argument("--speculative-eagle-topk", type=int, default=None)
    srv.add_argument("--page-size", type=int, default=None)
    srv.add_argument("--enable-two-batch-overlap", action="store_true")
    srv.add_argument("--attn-dp-size", type=int, default=1)
    srv.add_argument("--tp-size", "--tp", type=int, default=1)
    srv.add_argument("--pp-size", "--pp", type=int, default=1)
    srv.add_argument("--disaggregation-mode", default="null", choices=("null", "prefill", "decode"))
    srv.add_argument("--ep-size", "--ep", type=int, default=1)
    srv.add_argument("--moe-a2a-backend", default="none")
    srv.add_argument("--moe-dense-tp-size", type=int, default=None)
    srv.add_argument("--disable-overlap-schedule", action="store_true")
    srv.add_argument("--speculative-adaptive", action="store_true")
    srv.add_argument("--enable-return-routed-experts", action="store_true")
    srv.add_argument("--enable-return-indexer-topk", action="store_true")
    srv.add_argument("--expert-distribution-recorder-mode", default=None)
    srv.add_argument("--enable-eplb", action="store_true")
    srv.add_argument("--speculative-num-steps", type=int, default=None)
    srv.add_argument("--disable-cuda-graph", action="store_true")
    srv.add_argument("--enable-lora", action="store_true")
    srv.add_argument("--enable-pdmux", action="store_true")
    srv.add_argument("--enable-hostsync-plugin", action="store_true", help="accepted; the doctor assumes it")
    return parser


# What the opt-in presets' slots were worth in real servers (tok/s/user over the selection without them).
FLASHINFER_PRESET_GAIN = ("on the H200, default,flashinfer gave 1.06-1.11x stock's tok/s/user against the default "
                          "slots' 0.99-1.07x (benchmarks/results/2026-12-01-h200-flashinfer-matrix/); in later runs "
                          "1.12-1.19x, once 0.94x (2026-12-02-h200-c/)")
NGRAM_PRESET_GAIN = ("with default,eagle_host,ngram_host an H100 NGRAM server with real acceptance ran 1.171x stock's "
                     "tok/s/user at c8 (6 rounds, 1.118-1.212), outputs identical, a small host-bound target "
                     "(benchmarks/results/2026-12-06-h100-real-traffic/)")
# Preset -> (does it concern these server facts, what its slots do, what they were worth).
PRESET_HINTS = (
    (FLASHINFER_PRESET,
     lambda f: "flashinfer" in (*f.attention_backends, f.draft_attention_backend),
     "SGLang's opt-in FlashInfer host plans and the one-launch draft-extend layout, outputs unchanged",
     FLASHINFER_PRESET_GAIN),
    (NGRAM_PRESET, ServingFacts.is_ngram,
     "NGRAM's verify mask in one launch and its per-step wait moved to the draft prep, outputs unchanged",
     NGRAM_PRESET_GAIN),
)


def preset_hints(plan, catalogue, facts) -> list[str]:
    """Each opt-in preset's slots (``flashinfer``: SGLang's FlashInfer host-plan switches, opt-in as
    upstream ships them, and ``draft_extend_fused_layout``; ``ngram_host``: the NGRAM host-work slots)
    that these server args would use but the selection leaves off."""
    if facts is None:
        return []
    hints = []
    chosen = set(plan.selected) - not_picked(plan, facts, catalogue)
    for preset, concerns, what, gain in PRESET_HINTS:
        if not concerns(facts):
            continue
        useful = [name for name, slot in catalogue.items()
                  if preset in slot.presets and not slot.default and name not in chosen
                  and inert_reason(slot, facts) is None]
        if useful:
            hints.append(f"SGLANG_HOSTSYNC_SLOTS={plan.spec},{preset} also turns on {', '.join(useful)} ({what}); "
                         f"{gain}")
    return hints


def auto_hints(plan, facts) -> list[str]:
    """A selection without ``auto`` on a configuration ``auto`` has a measured pick for: what it would
    pick (a user who pinned ``default`` before ``auto`` existed, or copied an older set)."""
    picked = choice.pick(facts) if facts is not None and not choice.is_auto(plan.spec) else None
    if picked is None or picked.evidence is None or picked.spec == plan.spec:
        return []
    return [f"SGLANG_HOSTSYNC_SLOTS=auto (or unset) picks {picked.spec} here ({picked.label}: measured {picked.gain} "
            f"stock at c1 / c8, {picked.evidence})"]


def audit_hints(plan, catalogue, facts) -> list[str]:
    """With the audit selected: the slot that times this algorithm's step, where the selection
    leaves it off (the audit's own phases are EAGLE v2's)."""
    if facts is None or audit.NAME not in plan.selected:
        return []
    return [f"{name} is not selected: the audit's phases are the EAGLE v2 step's, which a "
            f"{facts.speculative_algorithm} step does not call (its host time would stay inside run_batch); "
            f"SGLANG_HOSTSYNC_SLOTS={plan.spec},{name}"
            for name in (audit_block.NAME, audit_ngram.NAME)
            if name not in plan.selected and inert_reason(catalogue[name], facts) is None]


def not_picked(plan, facts, catalogue) -> set[str]:
    """Under ``auto`` with a decided pick: the slots of its union of rows that the pick leaves out (an
    inert one's verdict gives its inert reason, not this)."""
    picked = choice.pick(facts) if choice.is_auto(plan.spec) else None
    if picked is None:
        return set()
    return set(plans.left_out(picked, plan.spec, set(plan.selected), catalogue))


def auto_line(plan) -> str | None:
    """What ``auto`` picked for the given server arguments, or why it waits (None: no ``auto``)."""
    if not choice.is_auto(plan.spec):
        return None
    return plan.choice or ("auto: decided once SGLang has resolved the server arguments (give "
                           "--speculative-algorithm, --speculative-eagle-topk, --page-size and --attention-backend "
                           "to see the pick); until then every slot it may pick is listed")


def facts_of(args) -> ServingFacts | None:
    """The server facts the doctor's server arguments give (None without an algorithm)."""
    if args.speculative_algorithm is None:
        return None
    return ServingFacts(
        speculative_algorithm=args.speculative_algorithm,
        dp_attention=args.attn_dp_size > 1,
        two_batch_overlap=args.enable_two_batch_overlap,
        tp_size=args.tp_size,
        pp_size=args.pp_size,
        disaggregation_mode=args.disaggregation_mode,
        topk=(args.speculative_eagle_topk if args.speculative_eagle_topk is not None
              else None if ServingFacts(args.speculative_algorithm).is_eagle_family() else 1),
        page_size=args.page_size,
        env=dict(os.environ),
        attention_backends=(args.prefill_attention_backend or args.attention_backend,
                            args.decode_attention_backend or args.attention_backend),
        draft_attention_backend=args.speculative_draft_attention_backend,
        moe_counts=args.ep_size > 1 or args.moe_a2a_backend != "none" or args.moe_dense_tp_size is not None,
        disable_overlap_schedule=args.disable_overlap_schedule,
        speculative_adaptive=args.speculative_adaptive,
        returns_capture_outputs=args.enable_return_routed_experts or args.enable_return_indexer_topk,
        expert_distribution=args.expert_distribution_recorder_mode is not None or args.enable_eplb,
        speculative_num_steps=args.speculative_num_steps,
        disable_cuda_graph=args.disable_cuda_graph,
        enable_lora=args.enable_lora,
        enable_pdmux=args.enable_pdmux,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["e2e"]:  # the end-to-end benchmark has its own parser
        from .e2e import main as e2e_main

        return e2e_main(argv[1:])
    # SGLang's modules warn on import about GPU-only features (AWQ, GGUF, FLA) and, on a CPU box, that its JIT
    # finds no CUDA architecture: not the doctor's news.
    arch = logging.getLogger(JIT_ARCH_LOGGER)
    arch.addFilter(_no_cuda_arch)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"sglang\.")
            return _main(argv)
    finally:
        arch.removeFilter(_no_cuda_arch)


JIT_ARCH_LOGGER = "sglang.kernels.jit.utils.arch"


def _no_cuda_arch(record: logging.LogRecord) -> bool:
    return record.getMessage() != "Cannot detect CUDA architecture."


def _main(argv: list[str]) -> int:
    parser = _parser()
    args, ignored = parser.parse_known_args(argv)
    if ignored and args.command != "doctor":
        parser.error(f"unrecognized arguments: {' '.join(ignored)}")
    if ignored:  # a whole server command line: the rest is SGLang's (a misspelt doctor argument shows here too)
        print(f"hostsync doctor: not read by the plugin's checks (SGLang's own): {' '.join(ignored)}",
              file=sys.stderr)
    if args.command == "prebuild":
        if missing := missing_modules(("torch",)):
            print(f"hostsync prebuild: {missing_message(missing, 'the kernels build with torch')}", file=sys.stderr)
            return 2
        from . import csrc

        return csrc.prebuild(tuple(args.kernels) or csrc.KERNELS)
    installed = version.installed_sglang()
    missing = missing_modules()
    if missing:
        message = missing_message(missing)
        print(f"hostsync doctor: {message}", file=sys.stderr)
        if args.json:
            print(json.dumps({"sglang": installed, "supported_sglang": version.SUPPORTED_SGLANG, "ok": False,
                              "error": message, "missing": missing, "slots": []}, indent=2))
        return 2
    facts = None
    seq_lens = None
    try:
        config.plugin_enabled()  # a malformed switch fails the server's startup too
        if args.speculative_algorithm is not None:
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

            SpeculativeAlgorithm.from_string(args.speculative_algorithm)  # ValueError names it
        facts = facts_of(args)
        plan = plans.resolve(facts=facts)  # what the launcher and every scheduler process compute
        if args.attention_backend or args.decode_attention_backend:
            seq_lens = backends.seq_lens_report(
                attention_backend=args.attention_backend,
                prefill_attention_backend=args.prefill_attention_backend,
                decode_attention_backend=args.decode_attention_backend,
                draft_attention_backend=args.speculative_draft_attention_backend,
                speculative_algorithm=args.speculative_algorithm,
                speculative_attention_mode=args.speculative_attention_mode,
                two_batch_overlap=args.enable_two_batch_overlap,
                overlap=not args.disable_overlap_schedule,
            )
    except (config.HostsyncConfigError, registry.SlotRegistryError, KeyError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) else str(exc)
        print(f"hostsync doctor: {message}", file=sys.stderr)
        if args.json:  # scripts read stdout
            print(json.dumps({"sglang": installed, "supported_sglang": version.SUPPORTED_SGLANG,
                              "ok": False, "error": message, "slots": []}, indent=2))
        return 2
    catalogue = registry.catalogue()
    hints = auto_hints(plan, facts) + preset_hints(plan, catalogue, facts) + audit_hints(plan, catalogue, facts)
    left_out = not_picked(plan, facts, catalogue)
    rows = report.doctor_rows(plan, catalogue, left_out)
    # What the selected slots that would apply change in the backends' stock per-step read, where there is one.
    applying = [v.name for v in plan.verdicts if v.selected and v.status in (Status.APPLIED, Status.WOULD_APPLY)]
    seq_lens_slots = {n: catalogue[n].seq_lens_read for n in applying if n in catalogue and catalogue[n].seq_lens_read
                      } if seq_lens is not None and seq_lens.d2h_per_step else {}
    common = dict(sglang=installed, supported_sglang=version.SUPPORTED_SGLANG, selected=list(plan.selected),
                  strict=plan.strict, choice=auto_line(plan))
    bad = plan.config_errors()
    if bad:  # the server would refuse these in argument preparation
        print("hostsync doctor: " + "; ".join(bad), file=sys.stderr)
        if args.json:
            print(report.doctor_json(rows, **common, ok=False, error="; ".join(bad)))
        return 2
    # Drift: any slot that fails against this SGLang (a bad env value of an unselected
    # slot is shown, but is no drift: it is never read).
    ok = not [v for v in plan.verdicts if v.status is Status.FAILED and (v.selected or not v.input_caused)]
    from .runtime import process_roles_found

    roles = process_roles_found()
    if args.json:
        d2h = seq_lens.as_dict() | {"slots": seq_lens_slots} if seq_lens else None
        print(report.doctor_json(rows, **common, ok=ok, seq_lens_d2h=d2h,
                                 hints=hints, warnings=plan.warnings(), process_roles=roles))
    else:
        runs = [n for n in plan.selected if n not in left_out]
        header = (
            f"sglang-hostsync-plugin doctor: sglang {installed} "
            f"(supported {version.SUPPORTED_SGLANG}); "
            f"{config.ENV_SLOTS}={plan.spec!r} selects: {', '.join(runs) or 'none'}; strict={plan.strict}"
        )
        width = None if args.wide else report.DOCTOR_WIDTH
        say = lambda text: print(report.fit(text, width))  # noqa: E731
        print(report.format_doctor(rows, header, width))
        if facts is None:
            say("(pass --speculative-algorithm etc. to check which slots would be inert)")
        if width is not None:
            say("(--wide: also each slot's kind, origin and default; --json: everything)")
        if seq_lens is not None:
            say(backends.format_report(seq_lens, seq_lens_slots))
        if common["choice"]:
            say(common["choice"])
        for warning in plan.warnings():
            say(f"warning: {warning}")
        for hint in hints:
            say(f"hint: {hint}")
        missing = [role for role, here in roles.items() if not here]
        say("process roles: " + ", ".join(f"{r} {'found' if here else 'NOT FOUND'}" for r, here in roles.items())
            + ("" if not missing else " (those processes register hooks as any other process; no slot is affected)"))
        say("OK: every slot is consistent with the installed sglang" if ok else "DRIFT: see the status column")
    return 0 if ok else 1
