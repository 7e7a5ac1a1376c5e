"""Kernel-by-kernel GPU µs per step, stock vs plugin, from a profile folder's .gpu.tsv.xz (40 steps
each), and the triton extend-attention kernel's duration at the start and end of each window (it
grows with the KV length, so it shows where in the request each window sat).

    python kernels.py profile-t4 > profile-t4/kernels.txt
    python kernels.py profile-t4-after > profile-t4-after/kernels.txt"""
import collections
import lzma
import os
import sys

STEPS = 40
ARMS = {"stock": "standalone-t4-p16__stock.gpu.tsv.xz",
        "plugin": "standalone-t4-p16__slots_default_eagle_host_-audit.gpu.tsv.xz"}


def load(path):
    n, us, fwd = collections.Counter(), collections.Counter(), []
    for i, line in enumerate(lzma.open(path, "rt")):
        if i == 0:
            continue
        ts, dur, cat, _, _, _, name = line.rstrip("\n").split("\t")
        if cat != "kernel":
            continue
        n[name[:70]] += 1
        us[name[:70]] += float(dur)
        if name == "_fwd_kernel":
            fwd.append((float(ts), float(dur)))
    return n, us, [d for _, d in sorted(fwd)]


data = {arm: load(os.path.join(sys.argv[1], p)) for arm, p in ARMS.items()}
(ns, ts, fs), (np_, tp, fp) = data["stock"], data["plugin"]
print(f"all kernels µs/step: stock {sum(ts.values()) / STEPS:.1f}, plugin {sum(tp.values()) / STEPS:.1f}")
for arm, (_, _, f) in data.items():
    print(f"{arm}: _fwd_kernel µs, first 34 calls mean {sum(f[:34]) / 34:.1f}, last 34 mean {sum(f[-34:]) / 34:.1f}")
print("\nper step: stock count, µs | plugin count, µs | plugin - stock µs | kernel (largest differences first)")
for name in sorted(set(ts) | set(tp), key=lambda k: -abs(tp[k] - ts[k]))[:30]:
    print(f"{ns[name] / STEPS:6.2f} {ts[name] / STEPS:8.1f} | {np_[name] / STEPS:6.2f} {tp[name] / STEPS:8.1f} | "
          f"{(tp[name] - ts[name]) / STEPS:+7.1f} | {name}")
topk = ("mbtopk", "sbtopk", "bitonicSort", "scan_by_key", "SoftMax")
for arm, (_, us, _) in data.items():
    part = {k: sum(v for n, v in us.items() if k in n) / STEPS for k in topk}
    print(f"\n{arm}: softmax / top-k kernels µs per step: " + ", ".join(f"{k} {v:.1f}" for k, v in part.items()))
