"""2026-12-02-h200/fdpl-t4/: the audited arms of that run, per concurrency, from their traces (the run's e2e.json was lost
when a server died, which the e2e now survives). Each server's trace holds only its own steps;
the arms took turns, so its timed rounds are its bursts of steps: after the identity and warm-up
bursts come c1 rounds 0-2, c8 rounds 0-2, and the final flush request.

    python benchmarks/analysis/fdpl_t4_bursts.py benchmarks/results/2026-12-02-h200/fdpl-t4

A folder stands for its ``*.trace.tsv.xz``, read from the run folder's ``raw.tar.xz``; trace paths
work too. (Until 2026-12-06 this script was ``benchmarks/results/2026-12-02-h200/fdpl-t4/analysis.py``.)
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), os.path.join(HERE, "..")]  # the repository, benchmarks/

import raw_archive  # noqa: E402  (the traces are inside the run folder's raw.tar.xz)

from sglang_hostsync_plugin.e2e import stats  # noqa: E402
from sglang_hostsync_plugin.slots.audit import parse_trace  # noqa: E402

from _traces import bursts  # noqa: E402


paths = []
for arg in sys.argv[1:]:
    paths += ([os.path.join(arg, n) for n in raw_archive.listdir(arg) if n.endswith(".trace.tsv.xz")]
              if os.path.isdir(arg) else [arg])
phases = {}
for path in paths:
    name = os.path.basename(path).split("__", 1)[1].split(".trace")[0]
    b = bursts(parse_trace(raw_archive.read_text(path)))
    for conc, windows in (("c1", b[-7:-4]), ("c8", b[-4:-1])):
        p = stats.pool_audit(windows)
        print(f"{name} {conc}: steps {p['steps']}, syncs/step {p['syncs_per_step']:.2f}, run-ahead "
              f"{p['run_ahead_fraction']:.3f} (worst round {p['run_ahead_fraction_min_round']:.3f}), lead median "
              f"{p['launch_lead_ms_median']:.2f} ms, host µs/step {p['host_us_per_step_median']:.0f}")
        phases[(name, conc)] = {ph["phase"]: ph["host_us_per_step"] for ph in p["attribution"]["phases"]}
keys = list(phases)
print("\n| phase | " + " | ".join(f"{n} {c}" for n, c in keys) + " |")
print("| --- |" + " --- |" * len(keys))
for ph in sorted(set().union(*phases.values()), key=lambda n: -phases[keys[0]].get(n, 0)):
    print(f"| {ph} | " + " | ".join(f"{phases[k].get(ph, 0):.0f}" for k in keys) + " |")

# Where run-ahead is lost: decode pairs with lead <= 0, split by whether they fall in the first
# 10 steps of a request (a c1 round runs its requests back to back, a new one every
# steps/requests steps) or later.
print("\n| arm | c1 round | decode pairs | lead <= 0 | of them in a request's first 10 steps |")
print("| --- | --- | --- | --- | --- |")
for path in paths:
    name = os.path.basename(path).split("__", 1)[1].split(".trace")[0]
    b = bursts(parse_trace(raw_archive.read_text(path)))
    for rnd, w in enumerate(b[-7:-4]):
        by = {s.step: s for s in w}
        per_request = len(w) / 6  # --requests 6 at c1
        pairs = [(s.step - w[0].step, s.t_finish - by[s.step + 1].t_launch) for s in w
                 if s.decode and s.step + 1 in by and by[s.step + 1].decode]
        neg = [i for i, lead in pairs if lead <= 0]
        early = [i for i in neg if i % per_request < 10]
        print(f"| {name} | {rnd} | {len(pairs)} | {len(neg)} | {len(early)} |")
