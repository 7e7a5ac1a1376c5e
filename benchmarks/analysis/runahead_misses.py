"""Where the run-ahead misses are: for each audited arm of an e2e run and each concurrency, the
decode-step pairs of its timed windows (e2e.json rows) whose launch lead is not positive, by how
many steps after the last prefill they came, and the GPU-idle time before each step.

    python benchmarks/analysis/runahead_misses.py benchmarks/results/2026-12-02-h200-c/eagle-host-t1-t4

(The traces are read from the run folder's ``raw.tar.xz``; until 2026-12-06 this script lived in
``benchmarks/results/2026-12-02-h200-c/``.)
"""

import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), os.path.join(HERE, "..")]  # the repository, benchmarks/

import raw_archive  # noqa: E402  (the traces are inside the run folder's raw.tar.xz)

from sglang_hostsync_plugin.e2e import matrix  # noqa: E402
from sglang_hostsync_plugin.slots.audit import parse_trace  # noqa: E402

BUCKETS = ((1, 1), (2, 3), (4, 6), (7, 10), (11, 10**9))


def main(folder):
    run = json.loads(raw_archive.read_text(os.path.join(folder, "e2e.json")))
    for name in raw_archive.listdir(folder):
        if ".trace.tsv" not in name:
            continue
        stem = name.split(".trace")[0]
        config = stem.split("__", 1)[0]
        steps = parse_trace(raw_archive.read_text(os.path.join(folder, name)))
        by = {s.step: s for s in steps}
        since = {}
        for s in steps:  # decode steps since the last non-decode step (1 = the first decode step after it)
            since[s.step] = since.get(s.step - 1, 0) + 1 if s.decode else 0
        for conc in sorted({r["concurrency"] for r in run["rows"]}):
            rows = [r for r in run["rows"] if r["config"] == config and r["concurrency"] == conc
                    and matrix.file_stem(config, r["arm"]) == stem]
            pairs, misses, idle = 0, collections.Counter(), 0.0
            total = collections.Counter()
            for s in steps:
                if not any(r["t_start"] <= s.t_launch <= r["t_end"] for r in rows):
                    continue
                n = by.get(s.step + 1)
                if n is None or not (s.decode and n.decode) or s.t_finish != s.t_finish:
                    continue
                pairs += 1
                k = next(i for i, (lo, hi) in enumerate(BUCKETS) if lo <= since[s.step] <= hi)
                total[k] += 1
                if s.t_finish - n.t_launch <= 0:
                    misses[k] += 1
                if n.gpu_idle_us == n.gpu_idle_us:
                    idle += n.gpu_idle_us
            if not pairs:
                continue
            cells = ", ".join(f"{lo}-{hi if hi < 10**9 else 'end'}: {misses[i]}/{total[i]}"
                              for i, (lo, hi) in enumerate(BUCKETS))
            print(f"{stem} c{conc}: {pairs} decode pairs, run-ahead {1 - sum(misses.values()) / pairs:.3f}; "
                  f"misses by steps after the prefill ({cells}); GPU idle before a step {idle / pairs:.0f} µs per step")


if __name__ == "__main__":
    main(sys.argv[1])
