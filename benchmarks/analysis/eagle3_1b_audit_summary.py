# benchmarks/results/2026-12-04-h200-c/eagle3-1b-audit/ (summary.txt there): eagle3-t4-p16, Llama-1B shape,
# c1 round 0 (the e2e was stopped by its time limit before its report): per-step audit figures from the two
# audited servers' traces (inside that run folder's raw.tar.xz), the timed round only (the longest run of
# steps without a 1 s gap; the shorter runs are the identity prompts). Until 2026-12-06 this script was that
# folder's summary.py. Run from the repository root:
#   python benchmarks/analysis/eagle3_1b_audit_summary.py
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(here, "..", ".."), os.path.join(here, "..")]  # the repository, benchmarks/
import raw_archive
from sglang_hostsync_plugin.slots.audit import parse_trace
from sglang_hostsync_plugin.e2e import stats
run = os.path.join(here, "..", "results", "2026-12-04-h200-c", "eagle3-1b-audit")
for arm in ("audit", "slots_default_eagle_host"):
    steps = parse_trace(raw_archive.read_text(os.path.join(run, f"eagle3-t4-p16__{arm}.trace.tsv.xz")))
    segs = [[steps[0]]]
    for a, b in zip(steps, steps[1:]):
        (segs.append([b]) if b.t_launch - a.t_launch > 1.0 else segs[-1].append(b))
    p = stats.pool_audit([max(segs, key=len)])
    print(f"{arm}: steps {p['steps']}, syncs/step {p['syncs_per_step']:.2f}, run-ahead {p['run_ahead_fraction']:.3f}, "
          f"lead ms median {p['launch_lead_ms_median']:.2f}, host µs/step (CPU) {p['host_us_per_step_median']:.0f}, "
          f"host work µs/step {p['host_work_us_per_step']:.0f}")
    print("  sync sites per step:", {k: round(v, 2) for k, v in p["sync_sites"].items()})
    att = p["attribution"]
    print(f"  step window µs {att['window_us_per_step']:.0f}; phases (µs per step, while the GPU was idle):")
    print("   ", ", ".join(f"{r['phase']} {r['host_us_per_step']:.0f} ({r['gpu_idle_us_per_step']:.0f})" for r in att["phases"]))
