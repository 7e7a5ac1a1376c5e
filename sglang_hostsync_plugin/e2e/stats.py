"""The benchmark's arithmetic: per-window audit figures from the trace, per-cell
aggregates over rounds, output identity, and the report (markdown, JSON rows)."""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Iterable, Sequence

from ..slots.audit import RAMP_STEPS, TraceStep, run_ahead_fraction
from ..slots.audit_phases import MARKS as MARKS_PHASE, SEQ_LENS_RESOLVE, pool_phases
from .client import Result
from .matrix import STOCK, STOCK_CODE


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100); None for no values."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50.0)


def window(steps: Iterable[TraceStep], t_start: float, t_end: float) -> list[TraceStep]:
    """The steps launched inside [t_start, t_end] (host clock)."""
    return [s for s in steps if t_start <= s.t_launch <= t_end]


# Decode steps after a prefill (1 = the first decode step after it): where run-ahead misses
# fall. Each prefill puts the host behind the GPU; it catches up over the next steps.
RAMP_BUCKETS = ((1, 1), (2, 3), (4, 10), (11, None))
RAMP = RAMP_STEPS  # the audit's own steady-state cut


def steps_since_prefill(steps: Iterable[TraceStep]) -> dict[int, int]:
    """Step -> decode steps since the last non-decode step; a window's leading decode steps count
    from its start (as if a prefill had just run)."""
    since, run = {}, 0
    for s in sorted(steps, key=lambda s: s.step):
        run = run + 1 if s.decode else 0
        since[s.step] = run
    return since


def ramp_table(lead_since: Sequence[tuple[int, float]], start_leads: Sequence[float] = ()) -> dict:
    """Misses, decode pairs and median lead per RAMP_BUCKETS entry, the run-ahead after RAMP steps, and
    the median start lead (a prefill's GPU finish minus the first decode step's launch: how far behind
    the host starts; each later pair gains the GPU step minus the host's)."""
    buckets = []
    for lo, hi in RAMP_BUCKETS:
        inside = [lead for since, lead in lead_since if since >= lo and (hi is None or since <= hi)]
        buckets.append({"from": lo, "to": hi, "pairs": len(inside), "misses": sum(lead <= 0 for lead in inside),
                        "lead_ms_median": median(inside)})
    after = [lead for since, lead in lead_since if since > RAMP]
    return {"buckets": buckets, "run_ahead_after_ramp": run_ahead_fraction(after) if after else None,
            "start_lead_ms_median": median(start_leads), "starts": len(start_leads)}


# A decode step whose scheduler CPU time exceeds this many times its window's median is a host stall
# (the median holds the spin-wait for the GPU where the host is ahead, so it is about a GPU step there);
# the run of misses it starts, the host catching up afterwards, is counted apart in the ramp table.
STALL_FACTOR = 2.0


def stall_misses(steps: list[TraceStep], lead_pairs: Sequence[tuple[int, float]]) -> dict:
    """Host stalls and the misses in their wake. ``lead_pairs``: (step N+1, lead of the pair N, N+1).
    A stall is a decode step with host CPU time over STALL_FACTOR x the window's median; a run of
    consecutive missed pairs whose first later step is a stall counts whole as after that stall."""
    host = [s.host_us for s in steps if s.decode and not math.isnan(s.host_us)]
    limit = STALL_FACTOR * median(host) if host else math.inf
    stalled = {s.step for s in steps if s.decode and s.host_us > limit}
    after, misses, run_step, in_run = 0, 0, None, False
    for later, lead in sorted(lead_pairs):
        if lead > 0:
            run_step = None
            continue
        misses += 1
        if run_step is None or later != run_step + 1:  # a new run of misses begins here
            in_run = later in stalled
        run_step = later
        after += in_run
    return {"stalls": len(stalled), "misses": misses, "misses_after_stalls": after}


def audit_figures(steps: list[TraceStep]) -> dict:
    """syncs/step with sites, decode-pair launch leads, run-ahead, host µs/step."""
    by_step = {s.step: s for s in steps}
    since = steps_since_prefill(steps)
    pairs = [
        (s.step + 1, since[s.step], (s.t_finish - by_step[s.step + 1].t_launch) * 1e3)
        for s in steps
        if s.decode and s.step + 1 in by_step and by_step[s.step + 1].decode and not math.isnan(s.t_finish)
    ]
    lead_since = [(k, lead) for _, k, lead in pairs]
    leads = [lead for _, lead in lead_since]
    stalls = stall_misses(steps, [(later, lead) for later, _, lead in pairs])
    # Between the GPU finishes of a decode pair: the decode time the misses' late launches are a share of.
    spans = [
        (by_step[s.step + 1].t_finish - s.t_finish) * 1e3
        for s in steps
        if s.decode and s.step + 1 in by_step and by_step[s.step + 1].decode
        and not math.isnan(s.t_finish) and not math.isnan(by_step[s.step + 1].t_finish)
    ]
    start_leads = [
        (s.t_finish - by_step[s.step + 1].t_launch) * 1e3
        for s in steps
        if not s.decode and s.step + 1 in by_step and by_step[s.step + 1].decode and not math.isnan(s.t_finish)
    ]
    sites = collections.Counter(site for s in steps for site in s.sites)
    n = len(steps)
    return {
        "steps": n,
        "syncs_per_step": sum(sites.values()) / n if n else None,
        "sync_sites": {k: v / n for k, v in sites.most_common()} if n else {},
        "run_ahead_fraction": run_ahead_fraction(leads) if leads else None,
        "launch_lead_ms_median": median(leads),
        "launch_lead_ms_p10": percentile(leads, 10.0),
        "lead_pairs": len(leads),
        "host_us_per_step_median": median([s.host_us for s in steps if s.decode]),
        **late_launch(sum(-lead for lead in leads if lead < 0), sum(spans)),
        "leads_ms": leads,
        "lead_since": lead_since,
        "start_leads_ms": start_leads,
        "ramp": ramp_table(lead_since, start_leads),
        "stalls": stalls,
    }


def late_launch(late_ms: float, span_ms: float) -> dict:
    """The misses' lateness (GPU finish of step N to the launch of N+1, summed) as a share of the decode
    time between the pairs' GPU finishes: an upper bound of the GPU idle the misses cost (the GPU may
    start N+1's first kernels before its launch completes)."""
    return {"late_ms": late_ms, "decode_span_ms": span_ms, "late_share": late_ms / span_ms if span_ms > 0 else None}


RESULT_PHASE = "result"  # process_batch_result: where the host waits for the GPU when it is ahead
# FutureMap.resolve_seq_lens_cpu: where FlashInfer and NGRAM wait for the previous step (a spinning
# synchronize); elsewhere a gather of a few µs. Timed since 2026-12-05: earlier traces have no such phase.
# ngram_late_wait's wait at the draft prep counts here too since 2026-12-07 (before: in ngram_draft).
SEQ_LENS_PHASE = SEQ_LENS_RESOLVE
SIMULATE_PHASE = "simulate"  # SGLang's simulated acceptance: benchmark-only host work, in every arm


def phase_us(attribution: dict, phase: str) -> float | None:
    """Host µs per attributed step of one phase (0 when it never ran); None without attributed steps."""
    if not attribution or not attribution.get("attributed_steps"):
        return None
    return sum(r["host_us_per_step"] for r in attribution["phases"] if r["phase"] == phase)


def host_work_us(attribution: dict) -> float | None:
    """Host µs per attributed step without ``process_batch_result``, which holds the wait for the
    GPU when the host is ahead (and ~0.1 ms of real work), and without the seq-lens resolve, which
    holds FlashInfer's and NGRAM's per-step wait: the host's own time per step, the figure to compare
    between arms when their pace differs. None without attributed steps."""
    result = phase_us(attribution, RESULT_PHASE)
    if result is None:
        return None
    return attribution["window_us_per_step"] - result - phase_us(attribution, SEQ_LENS_PHASE)


def first_decode_steps(steps: Sequence[TraceStep]) -> set[int]:
    """The decode steps that follow a non-decode step of the window: the audit attributes their window
    (from that step's launch) into the trace only, kept out of the per-step table as well."""
    prefills = {s.step for s in steps if not s.decode}
    return {s.step for s in steps if s.decode and s.step - 1 in prefills}


def ramp_work(steps: Sequence[TraceStep]) -> dict:
    """Host work and GPU idle per attributed step over some decode steps (one RAMP_BUCKETS entry)."""
    a = pool_phases(steps)
    return {"attributed_steps": a.get("attributed_steps", 0), "host_work_us": host_work_us(a),
            "gpu_idle_us": a.get("gpu_idle_us_per_step")}


def pool_audit(windows: list[list[TraceStep]]) -> dict:
    """Audit figures over several windows (rounds): steps pooled, pairs kept within a window."""
    figures = [audit_figures(w) for w in windows]
    steps = sum(f["steps"] for f in figures)
    leads = [v for f in figures for v in f["leads_ms"]]
    sites = collections.Counter()
    for w in windows:
        sites.update(site for s in w for site in s.sites)
    first, since = [], []  # per window: the first decode steps after a prefill; (decode step, steps since it)
    for w in windows:
        counts, f = steps_since_prefill(w), first_decode_steps(w)
        first.append(f)
        # The ramp table counts a window's leading decode steps as after a prefill; their windows are not.
        since += [(s, counts[s.step]) for s in w if s.decode and (counts[s.step] > 1 or s.step in f)]
    attribution = pool_phases([s for w, f in zip(windows, first) for s in w if s.step not in f])
    return {
        "steps": steps,
        "syncs_per_step": sum(sites.values()) / steps if steps else None,
        "sync_sites": {k: v / steps for k, v in sites.most_common()} if steps else {},
        "run_ahead_fraction": run_ahead_fraction(leads) if leads else None,
        "run_ahead_fraction_min_round": min((f["run_ahead_fraction"] for f in figures if f["run_ahead_fraction"] is not None), default=None),
        "launch_lead_ms_median": median(leads),
        "launch_lead_ms_p10": percentile(leads, 10.0),
        "lead_pairs": len(leads),
        "host_us_per_step_median": median([s.host_us for w in windows for s in w if s.decode]),
        **late_launch(sum(f["late_ms"] for f in figures), sum(f["decode_span_ms"] for f in figures)),
        "attribution": attribution,
        "attribution_first": pool_phases([s for w, f in zip(windows, first) for s in w if s.step in f]),
        "ramp_work": [ramp_work([s for s, k in since if k >= lo and (hi is None or k <= hi)])
                      for lo, hi in RAMP_BUCKETS],
        "host_work_us_per_step": host_work_us(attribution),
        # Part of that work real serving does not do (SGLANG_SIMULATE_ACC_LEN's acceptance draw).
        "simulated_acceptance_us_per_step": phase_us(attribution, SIMULATE_PHASE),
        "ramp": ramp_table([p for f in figures for p in f["lead_since"]],
                           [v for f in figures for v in f["start_leads_ms"]]),
        "stalls": {k: sum(f["stalls"][k] for f in figures) for k in ("stalls", "misses", "misses_after_stalls")},
    }


def rank_figures(windows: list[list[TraceStep]]) -> dict:
    """A further rank's scheduler (TP/DP servers) over its cell's windows: its syncs, run-ahead and host work."""
    a = pool_audit(windows)
    return {k: a[k] for k in ("steps", "syncs_per_step", "sync_sites", "run_ahead_fraction", "host_work_us_per_step")}


def load_figures(results: Sequence[Result], wall: float) -> dict:
    per_user = [r.tok_per_s for r in results]
    accept = [r.accept_length for r in results if r.accept_length is not None]
    tokens = sum(r.completion_tokens for r in results)
    return {
        "requests": len(results),
        "tok_s_user_median": median(per_user),
        "tok_s_user_p10": percentile(per_user, 10.0),
        "tok_s_total": tokens / wall if wall > 0 else None,
        "accept_length": statistics.fmean(accept) if accept else None,
        "tok_s_user_all": per_user,
    }


def compare_outputs(reference: Sequence[Result], got: Sequence[Result]) -> dict:
    """Greedy identity of ``got`` against ``reference`` (same prompts, same order):
    token ids always, per-position token and top-k logprobs where both have them."""
    if len(reference) != len(got):
        return {"identical": False, "first_mismatch": f"{len(got)} outputs, expected {len(reference)}",
                "logprobs_compared": False, "prompts": len(reference)}
    logprobs = all(r.logprobs is not None for r in (*reference, *got))
    for i, (ref, out) in enumerate(zip(reference, got)):
        if ref.output_ids != out.output_ids:
            j = next((k for k, (a, b) in enumerate(zip(ref.output_ids, out.output_ids)) if a != b),
                     min(len(ref.output_ids), len(out.output_ids)))
            return {"identical": False, "first_mismatch": f"prompt {i}, token {j}: output ids differ",
                    "logprobs_compared": logprobs, "prompts": len(reference)}
        if logprobs and ref.logprobs != out.logprobs:
            j = next((k for k, (a, b) in enumerate(zip(ref.logprobs, out.logprobs)) if a != b),
                     min(len(ref.logprobs), len(out.logprobs)))
            return {"identical": False, "first_mismatch": f"prompt {i}, position {j}: logprobs differ",
                    "logprobs_compared": True, "prompts": len(reference)}
    return {"identical": True, "first_mismatch": None, "logprobs_compared": logprobs, "prompts": len(reference)}


def distinct_tokens(results: Sequence[Result]) -> int:
    """How varied the outputs are (two alternating tokens make identity weak evidence)."""
    return len({t for r in results for t in r.output_ids})


def fmt(v, spec: str = ".2f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def by_round(a: dict, b: dict) -> list[float]:
    """Cell ``a``'s tok/s/user over cell ``b``'s, round by round, in the rounds both ran."""
    ra, rb = a.get("tok_s_user_by_round") or {}, b.get("tok_s_user_by_round") or {}
    return [r for k in sorted(ra.keys() & rb.keys()) if (r := _ratio(ra[k], rb[k])) is not None]


def cells(rows: list[dict], windows: dict[tuple, list[list[TraceStep]]] | None = None) -> list[dict]:
    """One row per (configuration, concurrency, arm): rounds pooled, ratio to stock.
    ``windows[(config, concurrency, arm)]``: that cell's trace window per round."""
    grouped: dict[tuple, list[dict]] = collections.defaultdict(list)
    ran: dict[tuple, set] = collections.defaultdict(set)  # (config, concurrency, round) -> the passes any arm ran
    for r in rows:
        grouped[(r["config"], r["concurrency"], r["arm"])].append(r)
        ran[(r["config"], r["concurrency"], r["round"])].add(r.get("pass", 0))  # .get: one pass before 2026-12-08
    out = []
    for (config, conc, arm), rs in grouped.items():
        per_user = [v for r in rs for v in r["load"]["tok_s_user_all"]]
        by_round: dict[int, list[float]] = collections.defaultdict(list)  # a round's passes pooled (--passes)
        whole: dict[int, set] = collections.defaultdict(set)
        for r in rs:
            by_round[r["round"]] += r["load"]["tok_s_user_all"]
            if r["load"]["tok_s_user_all"]:
                whole[r["round"]].add(r.get("pass", 0))
        accept = [r["load"]["accept_length"] for r in rs if r["load"]["accept_length"] is not None]
        cpu = [r["cpu"] for r in rs if r.get("cpu")]  # .get: rows from before 2026-12-07 21:30 UTC have none
        out.append({
            "config": config, "concurrency": conc, "arm": arm, "rounds": len(by_round),
            "requests": sum(r["load"]["requests"] for r in rs),
            "errors": sum(len(r.get("errors", ())) for r in rs),
            "tok_s_user_median": median(per_user),
            "tok_s_user_p10": percentile(per_user, 10.0),
            # a round the arm did not run whole (a pass missing or without a finished request) is left out
            "tok_s_user_by_round": {k: median(v) for k, v in by_round.items() if whole[k] == ran[(config, conc, k)]},
            "tok_s_total_median": median([r["load"]["tok_s_total"] for r in rs]),
            "accept_length": statistics.fmean(accept) if accept else None,
            "scheduler_wait_share": median([x["scheduler_wait_share"] for x in cpu]),
            "scheduler_preempted": sum(x["scheduler_preempted"] for x in cpu) if cpu else None,
            "scheduler_cpus": sorted({n for x in cpu for n in x["scheduler_cpus"]}),
            # .get: rows from before 2026-12-08 have none
            "others_cpus": median([x["others_cpus"] for x in cpu if x.get("others_cpus") is not None]),
            "audit": pool_audit(windows[(config, conc, arm)]) if windows and (config, conc, arm) in windows else None,
            "other_ranks": {str(k[3]): rank_figures(w) for k, w in (windows or {}).items()  # str: a JSON key
                            if len(k) == 4 and k[:3] == (config, conc, arm)},
        })
    stock = {(c["config"], c["concurrency"]): c for c in out if c["arm"] == "stock"}
    stock_code = {(c["config"], c["concurrency"]): c for c in out if c["arm"] == STOCK_CODE.name and c["audit"]}
    for c in out:
        ref = stock.get((c["config"], c["concurrency"]))
        c["ratio_tok_s_user"] = _ratio(c["tok_s_user_median"], ref["tok_s_user_median"] if ref else None)
        c["ratio_tok_s_total"] = _ratio(c["tok_s_total_median"], ref["tok_s_total_median"] if ref else None)
        # Each round against stock's same round (the arms of a round run back to back): the
        # spread the pooled ratio hides when the host drifts between rounds.
        mine, theirs = c["tok_s_user_by_round"], ref["tok_s_user_by_round"] if ref and ref is not c else {}
        c["ratio_by_round"] = [r for k in sorted(mine.keys() & theirs.keys())
                               if (r := _ratio(mine[k], theirs[k])) is not None]
        c.update(host_work_ratios(c, stock_code.get((c["config"], c["concurrency"]))))
    return out


def host_work_ratios(c: dict, ref: dict | None) -> dict:
    """A cell's host work over the stock-code arm's of its configuration and concurrency (the
    host-work target), also without SGLang's simulated acceptance (benchmark-only, in both); {} without them."""
    if ref is None or ref is c or not c["audit"]:
        return {}
    mine, theirs = c["audit"], ref["audit"]
    work, ref_work = mine.get("host_work_us_per_step"), theirs.get("host_work_us_per_step")
    sim, ref_sim = mine.get("simulated_acceptance_us_per_step"), theirs.get("simulated_acceptance_us_per_step")
    out = {"host_work_ratio_to_stock_code": _ratio(work, ref_work)}
    if None not in (work, ref_work, sim, ref_sim):
        out["host_work_ratio_to_stock_code_unsimulated"] = _ratio(work - sim, ref_work - ref_sim)
    return out


def unsimulated_lines(cell_rows: list[dict]) -> list[str]:
    """The host-work ratios again without SGLang's simulated acceptance (the ``simulate`` phase, on both
    sides): a real server draws none, so these are the ratios serving sees."""
    cells_ = [c for c in cell_rows if c.get("host_work_ratio_to_stock_code_unsimulated") is not None]
    if not cells_:
        return []
    return ["", "Host work x stock code's without SGLang's simulated acceptance (`SGLANG_SIMULATE_ACC_LEN`'s draw, "
                "benchmark-only host work in both arms): " + "; ".join(
                    f"{c['config']} c{c['concurrency']} {c['arm']} "
                    f"{fmt(c['host_work_ratio_to_stock_code_unsimulated'], '.3f')}x"
                    for c in sorted(cells_, key=lambda c: (c["config"], c["concurrency"], c["arm"])))]


def ratio_cell(c: dict) -> str:
    """The pooled ratio to stock and, over two or more rounds, the range of the per-round ratios."""
    by_round = c.get("ratio_by_round") or []
    spread = f" ({min(by_round):.3f}-{max(by_round):.3f})" if len(by_round) > 1 else ""
    return fmt(c["ratio_tok_s_user"], ".3f") + spread


FIRST_STEP_HEADING = ("Host µs of the first decode step after a prefill by phase, {config} (its window starts at "
                      "the prefill's launch; in parentheses: while the GPU was idle; attributed steps: {steps}):")


def attribution_tables(cell_rows: list[dict], key: str = "attribution",
                       heading: str = "Host µs per decode step by phase, {config} (in parentheses: while the GPU was idle):"
                       ) -> list[str]:
    """Per configuration: host µs per decode step by phase, and in parentheses the part
    that ran while the GPU was idle, for every cell with an attributed trace (``key``: the
    audit's steady steps, or ``attribution_first``, the first decode steps after a prefill)."""
    lines: list[str] = []
    by_config: dict[str, list[dict]] = collections.defaultdict(list)
    for c in sorted(cell_rows, key=lambda c: (c["config"], c["arm"], c["concurrency"])):
        if ((c["audit"] or {}).get(key) or {}).get("attributed_steps"):
            by_config[c["config"]].append(c)
    for config, cs in by_config.items():
        heads = [f"{c['arm']} c{c['concurrency']}" for c in cs]
        tables = [{r["phase"]: r for r in c["audit"][key]["phases"]} for c in cs]
        # Ranked by GPU-idle time, then host time (ties broken by name: the same order every run).
        order = sorted({p for t in tables for p in t},
                       key=lambda p: (-max(t.get(p, {}).get("gpu_idle_us_per_step", 0.0) for t in tables),
                                      -max(t.get(p, {}).get("host_us_per_step", 0.0) for t in tables), p))
        steps = ", ".join(str(c["audit"][key]["attributed_steps"]) for c in cs)
        lines += ["", heading.format(config=config, steps=steps), "",
                  "| phase | " + " | ".join(heads) + " |", "| --- |" + " --- |" * len(heads)]
        for phase in order:
            cells_ = [f"{fmt(t[phase]['host_us_per_step'], '.0f')} ({fmt(t[phase]['gpu_idle_us_per_step'], '.0f')})"
                      if phase in t else "-" for t in tables]
            lines.append(f"| {phase} | " + " | ".join(cells_) + " |")
        totals = [f"{fmt(c['audit'][key]['window_us_per_step'], '.0f')} "
                  f"({fmt(c['audit'][key]['gpu_idle_us_per_step'], '.0f')})" for c in cs]
        lines.append("| **step window (GPU idle)** | " + " | ".join(totals) + " |")
        if key == "attribution":
            lines += waits_inside_lines(cs)
    return lines


WAIT_INSIDE_US = 1000.0  # seq_lens_resolve per step from which a step counts as waiting inside run_batch


def waits_inside_lines(cs: list[dict]) -> list[str]:
    """The cells whose steps wait for the previous one inside ``run_batch`` (FlashInfer, NGRAM) and
    ran without GPU markers: the GPU idles after that wait, which their idle column (idle before
    ``run_batch`` begins) does not see."""
    notes = []
    for c in cs:
        wait = phase_us(c["audit"]["attribution"], SEQ_LENS_PHASE)
        if wait is not None and wait >= WAIT_INSIDE_US and not phase_us(c["audit"]["attribution"], MARKS_PHASE):
            notes.append(f"- {c['arm']} c{c['concurrency']}: each step waits for the previous one inside `run_batch` "
                         f"(`{SEQ_LENS_PHASE}` {wait:.0f} µs per step), and the GPU idles after that wait, which the "
                         f"column in parentheses leaves out: late launches "
                         f"{fmt(c['audit'].get('late_share'), '.2%')} of the decode time.")
    return [""] + notes if notes else []


AB_MIN_US = 50.0  # phases shorter than this do not vote on the two processes' host speed
NOT_PLUGIN = ("stock", "audit")  # arms that run stock code (their phases are not the plugin's)


def phase_ab_lines(cell_rows: list[dict]) -> list[str]:
    """Per (configuration, concurrency), each pair of audited plugin arms phase by phase: B's host µs
    over A's, and that ratio over the median ratio of the phases both time for at least AB_MIN_US
    in A (not the audit's own rows, nor ``result``, an ahead host's wait). Two server processes run
    at host speeds a few percent apart (the same code's phases all move together), so a slot's own
    effect is its phases' ratio beyond that median."""
    lines: list[str] = []
    grouped: dict[tuple, list[dict]] = collections.defaultdict(list)
    for c in sorted(cell_rows, key=lambda c: (c["config"], c["concurrency"], c["arm"])):
        if c["arm"] not in NOT_PLUGIN and ((c["audit"] or {}).get("attribution") or {}).get("attributed_steps"):
            grouped[(c["config"], c["concurrency"])].append(c)
    for (config, conc), cs in grouped.items():
        for i, a in enumerate(cs):
            for b in cs[i + 1:]:
                ta, tb = ({r["phase"]: r["host_us_per_step"] for r in c["audit"]["attribution"]["phases"]}
                          for c in (a, b))
                # Not the audit's own cost (@...), nor the result phase (an ahead host's wait).
                both = [p for p in ta if p in tb and not p.startswith("@") and p != RESULT_PHASE
                        and ta[p] and tb[p] is not None]
                speed = median([tb[p] / ta[p] for p in both if ta[p] >= AB_MIN_US])
                if speed is None:
                    continue
                lines += ["", f"Phases of {b['arm']} over {a['arm']}, {config} c{conc}: the median ratio of the "
                              f"phases of {AB_MIN_US:.0f} µs or more is {speed:.3f} (the two processes' host speed); "
                              "beyond it, a slot's own effect:", "",
                          "| phase | A µs | B µs | B / A | over the median |", "| --- | --- | --- | --- | --- |"]
                for p in sorted(both, key=lambda p: tb[p] / ta[p] / speed):
                    lines.append(f"| {p} | {ta[p]:.0f} | {tb[p]:.0f} | {tb[p] / ta[p]:.3f} | {tb[p] / ta[p] / speed:.3f} |")
    return lines


def arm_ab_lines(cell_rows: list[dict]) -> list[str]:
    """Per (configuration, concurrency), each pair of plugin arms alike in being audited or not: B's
    tok/s/user over A's in each round both ran (back to back in it), their median and the rounds B
    was faster. A slot's A/B read this way is free of the drift between rounds that each arm's ratio
    to stock carries."""
    grouped: dict[tuple, list[dict]] = collections.defaultdict(list)
    for c in sorted(cell_rows, key=lambda c: (c["config"], c["concurrency"], c["arm"])):
        if c["arm"] not in NOT_PLUGIN:
            grouped[(c["config"], c["concurrency"])].append(c)
    rows = []
    for (config, conc), cs in grouped.items():
        for i, a in enumerate(cs):
            for b in cs[i + 1:]:
                if (a["audit"] is None) != (b["audit"] is None):
                    continue  # the audit's own cost would count as the slots' difference
                by = by_round(b, a)  # as ratio_cell
                if len(by) > 1:
                    rows.append(f"| {config} | {conc} | {a['arm']} | {b['arm']} | {median(by):.3f} | "
                                f"{', '.join(f'{r:.3f}' for r in by)} | {sum(r > 1 for r in by)}/{len(by)} |")
    if not rows:
        return []
    return ["", "Plugin arms against each other, tok/s/user of B over A in each round both ran (arms alike in "
                "being audited or not):", "",
            "| config | conc | A | B | B / A median | by round | rounds B faster |",
            "| --- | --- | --- | --- | --- | --- | --- |", *rows]


def rank_lines(cell_rows: list[dict]) -> list[str]:
    """The further ranks' schedulers of multi-process servers (rank 0 is the table above)."""
    ranked = [c for c in cell_rows if c.get("other_ranks")]
    if not ranked:
        return []
    lines = ["", "Further ranks' schedulers (rank 0 is in the first table; each rank's own audit trace):", "",
             "| config | conc | arm | rank | steps | syncs/step | run-ahead | host work µs/step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in sorted(ranked, key=lambda c: (c["config"], c["concurrency"], c["arm"])):
        for rank, r in sorted(c["other_ranks"].items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {c['config']} | {c['concurrency']} | {c['arm']} | {rank} | {r['steps']} | "
                         f"{fmt(r['syncs_per_step'])} | {fmt(r['run_ahead_fraction'], '.3f')} | "
                         f"{fmt(r['host_work_us_per_step'], '.0f')} |")
    return lines


def ramp_lines(cell_rows: list[dict]) -> list[str]:
    """Run-ahead misses by decode steps after a prefill, per audited cell."""
    audited = [c for c in cell_rows if (c["audit"] or {}).get("ramp")]
    if not audited:
        return []
    heads = [f"{lo}" if hi == lo else (f"{lo}-{hi}" if hi else f"{lo}+") for lo, hi in RAMP_BUCKETS]
    lines = ["", "Run-ahead misses by decode steps after a prefill (misses / decode pairs, median lead ms); start "
                 "lead: the prefill's GPU finish minus the first decode step's launch; late launches: the misses' "
                 "lateness summed, % of the decode time, an upper bound of the GPU idle they cost (loose where most "
                 "pairs miss: the GPU starts a step's first graphs before its launch completes); host stalls: decode "
                 f"steps whose scheduler CPU time was over {STALL_FACTOR:g}x the window's median, and of all misses "
                 "those in the runs of misses such a step began (the host catching up after it):", "",
             "| config | conc | arm | start lead ms | " + " | ".join(heads) + f" | run-ahead after {RAMP} steps "
             "| late launches | host stalls (misses after them / all misses) |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in heads) + " | --- | --- | --- |"]
    for c in sorted(audited, key=lambda c: (c["config"], c["concurrency"], c["arm"])):
        ramp = c["audit"]["ramp"]  # .get: an e2e.json from before these fields (--merge)
        cells_ = " | ".join(f"{b['misses']}/{b['pairs']} ({fmt(b.get('lead_ms_median'), '+.1f')})"
                            for b in ramp["buckets"])
        stalls = c["audit"].get("stalls")
        stall_cell = ("-" if stalls is None
                      else f"{stalls['stalls']} ({stalls['misses_after_stalls']}/{stalls['misses']})")
        lines.append(f"| {c['config']} | {c['concurrency']} | {c['arm']} | "
                     f"{fmt(ramp.get('start_lead_ms_median'), '+.1f')} | {cells_} | "
                     f"{fmt(ramp['run_ahead_after_ramp'], '.3f')} | "
                     f"{fmt(c['audit'].get('late_share'), '.2%')} | {stall_cell} |")
    return lines


def ramp_work_lines(cell_rows: list[dict]) -> list[str]:
    """Host work per attributed decode step by decode steps after a prefill, per audited cell."""
    cells_ = [c for c in cell_rows if any(b["attributed_steps"] for b in (c["audit"] or {}).get("ramp_work") or ())]
    if not cells_:
        return []
    heads = [f"{lo}" if hi == lo else (f"{lo}-{hi}" if hi else f"{lo}+") for lo, hi in RAMP_BUCKETS]
    lines = ["", "Host work µs per attributed decode step by decode steps after a prefill (in parentheses: GPU idle "
                 "in the step's window; [attributed steps]); step 1's window starts at the prefill's launch:", "",
             "| config | conc | arm | " + " | ".join(heads) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in heads) + " |"]
    for c in sorted(cells_, key=lambda c: (c["config"], c["concurrency"], c["arm"])):
        row = " | ".join(f"{fmt(b['host_work_us'], '.0f')} ({fmt(b['gpu_idle_us'], '.0f')}) [{b['attributed_steps']}]"
                         if b["attributed_steps"] else "-" for b in c["audit"]["ramp_work"])
        lines.append(f"| {c['config']} | {c['concurrency']} | {c['arm']} | {row} |")
    return lines


def _yes(ok: bool, detail: str = "") -> str:
    return "yes" if ok else f"NO{': ' + detail if detail else ''}"


def traffic_markdown(traffic: dict[str, dict]) -> str:
    """The real-traffic pass's table: per server, the request mix one at a time against stock, the
    concurrent phase with aborted streams, the drain and the request after the aborts ('' without one)."""
    if not traffic:
        return ""
    lines = ["## Real traffic", "",
             "| server | one at a time: identical to stock | concurrent: completed / aborted / errors | health "
             "| KV tokens after the drain | log problems | after the aborts |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for key in sorted(traffic, key=lambda k: (k.split("/")[0], k.rsplit("/", 1)[-1] != STOCK.name, k)):
        t = traffic[key]
        seq = t.get("sequential")
        if seq is not None:
            first = seq["mismatches"][0] if seq["mismatches"] else {}
            one = (f"{seq['same']} / {seq['compared']}"
                   + (f" (first: {first.get('name')} {first.get('what')} at {first.get('at')})" if first else ""))
        else:
            one = "reference" if key.rsplit("/", 1)[-1] == STOCK.name else "-"
        if t.get("errors"):
            one += f"; {len(t['errors'])} request errors"
        c = t.get("concurrent")
        conc = f"{c['completed']} / {c['aborted']} / {len(c['errors'])}" if c else "-"
        after = t.get("after_aborts")
        if after is None:
            after_cell = "reference" if c and key.rsplit("/", 1)[-1] == STOCK.name else "-"
        else:
            after_cell = ("identical" if after["identical"] else "differs") + ("" if after["evidence"] else
                                                                              " (no evidence: trie)")
        lines.append(f"| {key} | {one} | {conc} | {'-' if not c else _yes(c['health'])} | "
                     f"{t.get('tokens_after_drain', '-')} | {len(t.get('log_problems') or [])} | {after_cell} |")
    return "\n".join(lines) + "\n\n"


AUTO_WITHIN = 0.98  # auto's bar: auto's tok/s/user at least 98% of the best identical arm's


NO_EVIDENCE = "no evidence"


def _identical(key: str, identity: dict, traffic: dict) -> bool | str | None:
    """True where every output check a server had against stock passed, False where one failed, NO_EVIDENCE
    where none failed but one could not decide (NGRAM's trie not flushed), None where it had none."""
    checks = []
    if key in identity:
        checks.append((bool(identity[key]["identical"]), identity[key].get("evidence", True)))
    t = traffic.get(key) or {}
    for part in ("sequential", "after_aborts"):
        if t.get(part) is not None:
            checks.append((bool(t[part]["identical"]), t[part].get("evidence", True)))
    if t.get("concurrent") is not None:
        checks.append((not t["concurrent"]["errors"] and not t.get("errors"), True))
    if not checks:
        return None
    if any(not same and evidence for same, evidence in checks):
        return False
    return True if all(evidence for _, evidence in checks) else NO_EVIDENCE


PIN = "pin it with SGLANG_HOSTSYNC_SLOTS="


def auto_pick(status_block: Sequence[str]) -> str | None:
    """The slot list ``auto`` picked, from the status block's ``auto:`` line (``choice.line``)."""
    for line in status_block:
        if line.strip().startswith("auto:") and PIN in line:
            return line.split(PIN, 1)[1].strip()
    return None


def auto_verdicts(cell_rows: list[dict], arm_slots: dict[str, str | None], identity: dict, traffic: dict,
                  servers: dict | None = None) -> list[dict]:
    """Per (configuration, concurrency) with an unaudited ``auto`` arm: whether it was identical to stock,
    its lowest round against stock, and its tok/s/user over the best unaudited arm identical to stock,
    round by round (auto's bar: identical, never below stock, within 2% of the best arm). Where the best arm
    runs the very set ``auto`` picked, the two are an A/A pair and ``auto`` is within by its choice."""
    def tokens(arm):
        return {t.strip() for t in (arm_slots.get(arm) or "").split(",")}

    def audited(c):  # by its slots where known: a report made without the traces has no audit figures
        return "audit" in tokens(c["arm"]) if c["arm"] in arm_slots else c["audit"] is not None

    def is_auto(arm):
        return "auto" in tokens(arm)

    grouped: dict[tuple, list[dict]] = collections.defaultdict(list)
    for c in cell_rows:
        if c["arm"] not in NOT_PLUGIN and not audited(c):
            grouped[(c["config"], c["concurrency"])].append(c)
    out = []
    for (config, conc), cs in sorted(grouped.items()):
        for auto in (c for c in cs if is_auto(c["arm"])):
            ok = {c["arm"]: _identical(f"{config}/{c['arm']}", identity, traffic) for c in cs}
            fair = [c for c in cs if ok[c["arm"]] is True and c["ratio_tok_s_user"] is not None]
            best = max(fair, key=lambda c: c["ratio_tok_s_user"], default=None)
            by = by_round(auto, best or {})
            over_best = median(by)
            lowest = min(auto["ratio_by_round"]) if auto["ratio_by_round"] else None
            picked = auto_pick(((servers or {}).get(f"{config}/{auto['arm']}") or {}).get("status_block") or ())
            same_set = (best is not None and best is not auto and picked is not None
                        and tokens(best["arm"]) == {t.strip() for t in picked.split(",")})
            # Two servers of the same code, where the run has them: `none` (the plugin, no slot) against stock,
            # and auto against the arm running its pick. Their gap is the run's noise at the bar's scale.
            pairs = [("none / stock", abs(c["ratio_tok_s_user"] - 1.0)) for c in cs
                     if tokens(c["arm"]) - {"-audit"} == {"none"} and c["ratio_tok_s_user"] is not None]
            pick = {t.strip() for t in picked.split(",")} if picked else None
            for twin in (c for c in cs if c is not auto and pick and tokens(c["arm"]) - {"-audit"} == pick):
                gap = median(by_round(auto, twin))
                if gap is not None:
                    pairs.append(("auto / its pick", abs(gap - 1.0)))
            aa = max(pairs, key=lambda p: p[1], default=(None, None))
            out.append({"config": config, "concurrency": conc, "arm": auto["arm"], "picked": picked,
                        "aa_pair": aa[0], "aa_gap": aa[1],
                        "identical": ok[auto["arm"]], "ratio": auto["ratio_tok_s_user"], "lowest_round": lowest,
                        "best": None if best is None else best["arm"],
                        "best_ratio": None if best is None else best["ratio_tok_s_user"],
                        "best_is_the_pick": same_set, "over_best": over_best, "rounds_paired": len(by),
                        "never_below": lowest is not None and lowest >= 1.0,
                        "within": same_set or (over_best is not None and over_best >= AUTO_WITHIN)})
    return out


AUTO_HEADER = ("| config | conc | auto arm | its pick | identical | over stock (lowest round) "
               "| best identical arm (over stock) | auto / best (rounds) | identical, never below stock, within "
               "| same-code gap (pair) |")


def auto_row(v: dict) -> str:
    same = {True: "yes", False: "NO", NO_EVIDENCE: "no evidence", None: "-"}[v["identical"]]
    return (f"| {v['config']} | {v['concurrency']} | {v['arm']} | {v['picked'] or '-'} | {same} | "
            f"{fmt(v['ratio'], '.3f')} ({fmt(v['lowest_round'], '.3f')}) | {v['best'] or '-'} "
            f"({fmt(v['best_ratio'], '.3f')}){' = the pick (A/A)' if v['best_is_the_pick'] else ''} | "
            f"{fmt(v['over_best'], '.3f')} ({v['rounds_paired']}) | {_yes(v['identical'] is True and v['never_below'] and v['within'])} | "
            + (f"{v['aa_gap']:.3f} ({v['aa_pair']}) |" if v.get("aa_gap") is not None else "- |"))


def auto_lines(verdicts: list[dict]) -> list[str]:
    if not verdicts:
        return []
    return ["", f"`auto` against stock and the best arm identical to stock (unaudited arms; within: at least "
                f"{AUTO_WITHIN:.0%} of the best, median of the rounds both ran; the same-code gap: how far two "
                "servers of the same code read apart in this run, `none` against stock or `auto` against the arm "
                "running its pick, where the run has them):", "",
            AUTO_HEADER, "|" + " --- |" * AUTO_HEADER.count(" | ") + " --- |", *map(auto_row, verdicts)]


def cpu_lines(cell_rows: list[dict]) -> list[str]:
    """Each cell's scheduler run-queue wait, preemptions and CPUs (``procs``): where same-code arms differ in
    speed, a scheduler that waited for its CPU or moved between CPUs points at the host's placement."""
    rows = [c for c in cell_rows if c.get("scheduler_wait_share") is not None]
    if not rows:
        return []
    lines = ["", "Scheduler placement: its main thread's run-queue wait (% of the window, median of rounds), "
             "preemptions (all rounds), the CPUs it was seen on, and the CPUs the other arms' schedulers used "
             "meanwhile (median; about 1 each where they spin idle, 0 asleep):", ""]
    for c in sorted(rows, key=lambda c: (c["config"], c["concurrency"], c["arm"] != "stock", c["arm"])):
        others = c.get("others_cpus")
        lines.append(f"- {c['config']} c{c['concurrency']} {c['arm']}: {100 * c['scheduler_wait_share']:.2f}%, "
                     f"{c['scheduler_preempted']} preemptions, CPUs {', '.join(map(str, c['scheduler_cpus']))}"
                     + ("" if others is None else f"; other arms' schedulers {others:.2f} CPUs"))
    return lines


def markdown(cell_rows: list[dict], servers: dict[str, dict], identity: dict[str, dict],
             arm_slots: dict[str, str | None] | None = None, traffic: dict | None = None) -> str:
    """The report: one table of cells, one of servers (ready time, identity)."""
    lines = [
        "| config | conc | arm | tok/s/user median (p10) | ratio (by round) | total tok/s | accept len | syncs/step | run-ahead (worst round) | lead ms median (p10) | host µs/step: CPU (work, x stock code's) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in sorted(cell_rows, key=lambda c: (c["config"], c["concurrency"], c["arm"] != "stock", c["arm"])):
        a = c["audit"] or {}
        lines.append(
            f"| {c['config']} | {c['concurrency']} | {c['arm']} | {fmt(c['tok_s_user_median'], '.1f')} "
            f"({fmt(c['tok_s_user_p10'], '.1f')}) | {ratio_cell(c)} | "
            f"{fmt(c['tok_s_total_median'], '.0f')} | {fmt(c['accept_length'])} | "
            f"{fmt(a.get('syncs_per_step'))} | {fmt(a.get('run_ahead_fraction'), '.3f')} "
            f"({fmt(a.get('run_ahead_fraction_min_round'), '.3f')}) | {fmt(a.get('launch_lead_ms_median'))} "
            f"({fmt(a.get('launch_lead_ms_p10'))}) | {fmt(a.get('host_us_per_step_median'), '.0f')} "
            f"({fmt(a.get('host_work_us_per_step'), '.0f')}"
            + (f", {fmt(c['host_work_ratio_to_stock_code'], '.3f')}x" if c.get("host_work_ratio_to_stock_code") is not None else "")
            + ") |"
        )
    lines += unsimulated_lines(cell_rows)
    lines += ["", "| server | ready s | KV pool tokens | first request s | greedy identical to stock | logprobs compared "
              "| distinct output tokens |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, s in servers.items():
        ident = identity.get(name)
        if ident is not None:
            verdict = "yes" if ident["identical"] else f"NO: {ident['first_mismatch']}"
            if not ident.get("evidence", True):  # .get: e2e.json from before the real-traffic pass
                verdict += " (no evidence: trie)"
        else:  # no verdict: the stock arm itself, or a server that never served
            verdict = "reference" if name.rsplit("/", 1)[-1] == STOCK.name else "-"
        lines.append(
            f"| {name} | {fmt(s.get('ready_s'), '.1f', 'failed')}{' (restarted alone)' if 'restarted_alone' in s else ''} | "
            f"{'-' if s.get('kv_tokens') is None else s['kv_tokens']} | {fmt(s.get('first_request_s'), '.3f')} | "
            f"{verdict} | "
            f"{'-' if ident is None else ('yes' if ident['logprobs_compared'] else 'no')} | {s.get('distinct_tokens', '-')} |"
        )
    unstarted = [(name, s["error"]) for name, s in servers.items() if s.get("ready_s") is None and s.get("error")]
    if unstarted:
        lines += ["", "Servers that did not start (the log tail, where one was started, is in e2e.json):", ""]
        lines += [f"- {name}: {why.splitlines()[0]}" for name, why in unstarted]
    died = [(name, s["died"]) for name, s in servers.items() if s.get("died")]
    if died:
        lines += ["", "Servers that died while serving (rows after that are missing; the log tail is in e2e.json):", ""]
        lines += [f"- {name}: {why}" for name, why in died]
    lines += rank_lines(cell_rows)
    lines += cpu_lines(cell_rows)
    lines += ramp_lines(cell_rows)
    lines += ramp_work_lines(cell_rows)
    lines += attribution_tables(cell_rows)
    lines += attribution_tables(cell_rows, "attribution_first", FIRST_STEP_HEADING)
    lines += auto_lines(auto_verdicts(cell_rows, arm_slots or {}, identity, traffic or {}, servers))
    lines += arm_ab_lines(cell_rows)
    lines += phase_ab_lines(cell_rows)
    sites = collections.Counter()
    for c in cell_rows:
        for site, per_step in ((c["audit"] or {}).get("sync_sites") or {}).items():
            sites[(c["config"], c["arm"], site)] = max(sites[(c["config"], c["arm"], site)], per_step)
    if sites:
        lines += ["", "Sync sites (per step, worst concurrency):", ""]
        lines += [f"- {cfg} / {arm}: `{site}` {v:.2f}" for (cfg, arm, site), v in sorted(sites.items())]
    checks = [(name, line) for name, s in servers.items() for line in s.get("slot_checks") or ()]
    if checks:
        lines += ["", "Slot self-checks (each slot's last line in the server log):", ""]
        lines += [f"- {name}: {line}" for name, line in checks]
    return "\n".join(lines) + "\n"
