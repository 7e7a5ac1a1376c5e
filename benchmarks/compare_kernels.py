"""Kernel by kernel, GPU µs per step of two arms of one ``profile_step_kernels.py`` output folder.

Reads ``<config>__<arm>.gpu.tsv.xz`` of both arms (from the folder, or from its run folder's
``raw.tar.xz`` under ``benchmarks/results/``: ``raw_archive.py``) and prints: all kernels' µs per
step, the triton extend-attention kernel's (``_fwd_kernel``) mean duration over its first and last
calls (it grows with the KV length: equal values mean the two windows sat at the same position in
the requests), the kernels whose per-step time differs most, and the draft's softmax / top-k kernels.

    python benchmarks/compare_kernels.py benchmarks/results/2026-12-04-h200/profile-c8 standalone-t4-p16
"""

from __future__ import annotations

import argparse
import collections
import json
import lzma
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_step_kernels import arm_stem  # noqa: E402  (how the profile names each arm's files)
import raw_archive  # noqa: E402

ATTENTION = "_fwd_kernel"
TOPK_PARTS = ("mbtopk", "sbtopk", "bitonicSort", "scan_by_key", "SoftMax")


def load(path: str, width: int = 70) -> tuple[collections.Counter, collections.Counter, list[float]]:
    """Kernel name (cut to ``width``) -> count and total µs; the attention kernel's durations in time order."""
    n, us, attention = collections.Counter(), collections.Counter(), []
    text = lzma.decompress(raw_archive.read_bytes(path)).decode()
    for line in text.split("\n")[1:]:  # after the header
        if not line:
            continue
        ts, dur, cat, _, _, _, name = line.split("\t")
        if cat != "kernel":
            continue
        n[name[:width]] += 1
        us[name[:width]] += float(dur)
        if name == ATTENTION:
            attention.append((float(ts), float(dur)))
    return n, us, [d for _, d in sorted(attention)]


def report(folder: str, config: str, base: str, other: str, steps: int, top: int = 30, edge: int = 34) -> str:
    (nb, tb, fb), (no, to, fo) = (load(os.path.join(folder, f"{config}__{arm}.gpu.tsv.xz")) for arm in (base, other))
    lines = [f"all kernels µs/step: {base} {sum(tb.values()) / steps:.1f}, {other} {sum(to.values()) / steps:.1f}"]
    for arm, f in ((base, fb), (other, fo)):
        if f:
            k = min(edge, len(f))
            lines.append(f"{arm}: {ATTENTION} µs, first {k} calls mean {sum(f[:k]) / k:.1f}, "
                         f"last {k} mean {sum(f[-k:]) / k:.1f}")
    lines += ["", f"per step: {base} count, µs | {other} count, µs | {other} - {base} µs | kernel (largest differences first)"]
    for name in sorted(set(tb) | set(to), key=lambda k: (-abs(to[k] - tb[k]), k))[:top]:
        lines.append(f"{nb[name] / steps:6.2f} {tb[name] / steps:8.1f} | {no[name] / steps:6.2f} {to[name] / steps:8.1f} | "
                     f"{(to[name] - tb[name]) / steps:+7.1f} | {name}")
    for arm, us in ((base, tb), (other, to)):
        part = {k: sum(v for n, v in us.items() if k in n) / steps for k in TOPK_PARTS}
        lines += ["", f"{arm}: softmax / top-k kernels µs per step: " + ", ".join(f"{k} {v:.1f}" for k, v in part.items())]
    return "\n".join(lines) + "\n"


def recorded_steps(folder: str, config: str, arm: str) -> int | None:
    """The step count ``profile_step_kernels.py`` recorded for this arm (profile.json), if any."""
    try:
        with open(os.path.join(folder, "profile.json")) as f:
            results = json.load(f)
    except (OSError, ValueError):
        return None
    for key, fig in results.items():
        if arm_stem(key) == f"{config}__{arm}" and isinstance(fig, dict) and "steps" in fig:
            return int(fig["steps"])
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="a profile_step_kernels.py --out folder")
    ap.add_argument("config", help="e.g. standalone-t4-p16")
    ap.add_argument("--base", default="stock", help="the first arm's file stem")
    ap.add_argument("--other", default="slots_default_eagle_host_-audit", help="the second arm's file stem")
    ap.add_argument("--steps", type=int, default=None, help="steps in each window (default: profile.json's, else 40)")
    args = ap.parse_args(argv)
    steps = {arm: args.steps or recorded_steps(args.folder, args.config, arm) or 40 for arm in (args.base, args.other)}
    if steps[args.base] != steps[args.other]:
        ap.error(f"the two windows have {steps[args.base]} and {steps[args.other]} steps; pass --steps")
    sys.stdout.write(report(args.folder, args.config, args.base, args.other, steps[args.base]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
