"""The per-step result readback (``Scheduler._copy_result_to_cpu`` -> ``GenerationBatchResult.copy_to_cpu``):
SGLang's one ``async_d2h`` per tensor (a pinned allocation, a D2H copy and a ``record_stream`` each;
"stock") against one packed D2H (the tensors' bytes gathered by one ``torch.cat`` on the copy stream
into one device buffer, one pinned allocation, one copy, dtype views of it on the host; "plugin"),
same tensors, on a side stream as the scheduler issues it. Host µs per call: is a packed readback
slot worth building (issue 16)? Values are checked equal after each arm.

    python benchmarks/bench_result_readback.py [--rounds 4] [--json out.json]
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from per_call import compare, parse_args, write_json  # noqa: E402

from sglang.srt.utils.common import async_d2h  # noqa: E402

ALIGN = 8


def tensors(bs: int, steps: int, logprobs: bool) -> list[torch.Tensor]:
    n = bs * (steps + 1)
    out = [torch.randint(0, 32000, (n,), dtype=torch.int32, device="cuda"),  # next_token_ids
           torch.randint(1, steps + 2, (bs,), dtype=torch.int32, device="cuda")]  # accept_lens
    if logprobs:
        out += [torch.randn(n, device="cuda"), torch.randn(n, 5, device="cuda"),
                torch.randint(0, 32000, (n, 5), dtype=torch.int64, device="cuda")]
    return out


def stock(stream, ts):
    with torch.cuda.stream(stream):
        host = [async_d2h(t) for t in ts]
    return host


def packed(stream, ts):
    with torch.cuda.stream(stream):
        parts, spans, off = [], [], 0
        for t in ts:
            nb = t.numel() * t.element_size()
            parts.append(t.reshape(-1).view(torch.uint8))
            pad = -nb % ALIGN
            if pad:
                parts.append(torch.empty(pad, dtype=torch.uint8, device=t.device))
            spans.append((off, nb, t.dtype, t.shape))
            off += nb + pad
            t.record_stream(stream)
        dev = torch.cat(parts)
        host = torch.empty(off, dtype=torch.uint8, pin_memory=True)
        host.copy_(dev, non_blocking=True)
        dev.record_stream(stream)
    return [host[o:o + nb].view(dt).view(shape) for o, nb, dt, shape in spans]


def main():
    ns = parse_args()
    stream = torch.cuda.Stream()
    rows = []
    for bs, steps, logprobs in ((1, 3, False), (1, 3, True), (8, 3, True)):
        ts = tensors(bs, steps, logprobs)
        a, b = stock(stream, ts), packed(stream, ts)
        torch.cuda.synchronize()
        assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a, b))
        row = {"bs": bs, "tensors": len(ts), **compare({"stock": stock, "plugin": packed}, stream, (ts,), ns)}
        rows.append(row)
        print(f"bs {bs} tensors {len(ts)}: host µs stock {row['stock']['host_us_median']:.1f} (p90 "
              f"{row['stock']['host_us_p90']:.1f}), packed {row['plugin']['host_us_median']:.1f} (p90 "
              f"{row['plugin']['host_us_p90']:.1f}); syncs {row['stock']['syncs_per_call']}/{row['plugin']['syncs_per_call']}")
    write_json(ns.json, rows)


if __name__ == "__main__":
    main()
