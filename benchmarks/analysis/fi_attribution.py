"""2026-12-02-h200-c/fi-dfl-attribution/: host µs per decode step by phase, `default,flashinfer` vs
`default,flashinfer,draft_extend_fused_layout` (both audited), FlashInfer STANDALONE topk 4 page 16
c1. The call ended at its time limit before the e2e wrote e2e.json, so the timed windows are cut
from the traces: each arm's steps in bursts (gaps over 1 s), its 3 timed c1 rounds being its bursts
of over 500 steps (two of the slot arm's rounds ran back to back: one burst).

    python benchmarks/analysis/fi_attribution.py benchmarks/results/2026-12-02-h200-c/fi-dfl-attribution

(The traces are read from ``benchmarks/results/2026-12-02-h200-c/raw.tar.xz``; until 2026-12-06 this
script lived in that folder.)
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), os.path.join(HERE, "..")]  # the repository, benchmarks/

import raw_archive  # noqa: E402  (the traces are inside the run folder's raw.tar.xz)

from sglang_hostsync_plugin.e2e import stats  # noqa: E402
from sglang_hostsync_plugin.slots.audit import parse_trace  # noqa: E402

from _traces import bursts  # noqa: E402

ARMS = ("slots_default_flashinfer", "slots_default_flashinfer_draft_extend_fused_layout")


def main(folder):
    phases = {}
    for arm in ARMS:
        steps = parse_trace(raw_archive.read_text(os.path.join(folder, f"standalone-t4-p16__{arm}.trace.tsv.xz")))
        p = stats.pool_audit([b for b in bursts(steps) if len(b) > 500][-3:])
        print(f"{arm}: steps {p['steps']}, syncs/step {p['syncs_per_step']:.2f}, run-ahead {p['run_ahead_fraction']:.3f}, "
              f"lead median {p['launch_lead_ms_median']:.2f} ms, host µs/step {p['host_us_per_step_median']:.0f}")
        phases[arm] = {ph["phase"]: ph["host_us_per_step"] for ph in p["attribution"]["phases"]}
    base, slot = (phases[a] for a in ARMS)
    print("\n| phase | default,flashinfer | + draft_extend_fused_layout | difference |\n| --- | --- | --- | --- |")
    for ph in sorted(base, key=lambda k: -base[k]):
        print(f"| {ph} | {base[ph]:.0f} | {slot.get(ph, 0):.0f} | {slot.get(ph, 0) - base[ph]:+.0f} |")


if __name__ == "__main__":
    main(sys.argv[1])
