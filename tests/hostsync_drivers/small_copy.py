"""Operands for ``try_small_copy`` (the slot ``small_copy_launch``): random (dst, src) lists shaped like
the CUDA-graph runners' input copies, plus the edge cases its checks sort out, and, for the CPU,
SGLang's own function with its CUDA check removed and its launch routed to a torch emulation."""

from __future__ import annotations

import inspect
import random
import textwrap

import torch

CUDA_CHECK = '    if device.type != "cuda":\n        return False\n'
LAUNCH = "        _small_copy_kernel[(len(dsts), triton.cdiv(largest, 256))](\n"


def stock_anywhere(launch):
    """SGLang's try_small_copy, from its source, taking CPU tensors and calling
    ``launch(grid, *kernel arguments, BLOCK=...)`` instead of the Triton kernel."""
    from sglang.kernels.ops.memory import small_copy

    src = textwrap.dedent(inspect.getsource(small_copy.try_small_copy))
    assert CUDA_CHECK in src and LAUNCH in src, "SGLang's try_small_copy changed shape"
    src = src.replace(CUDA_CHECK, "").replace(LAUNCH, "        _launch((len(dsts), triton.cdiv(largest, 256)),\n")
    scope = {"torch": torch, "triton": small_copy.triton, "_launch": launch}
    exec(compile(src, "<try_small_copy anywhere>", "exec"), scope)
    return scope["try_small_copy"]


def emulate(grid, sources, destinations, sizes, cols, source_strides, dest_strides, bit_widths, BLOCK=256):
    """What ``_small_copy_kernel`` writes: each field's first ``sizes[i]`` elements, row-major over
    ``cols[i]`` columns, through the given strides (a bit copy, or an int32/int64 cast)."""
    for i, (src, dst) in enumerate(zip(sources, destinations)):
        n, c = sizes[i], cols[i]
        if not n:
            continue
        k = torch.arange(n)
        s_off = (k // c) * source_strides[i][0] + (k % c) * source_strides[i][1]
        d_off = (k // c) * dest_strides[i][0] + (k % c) * dest_strides[i][1]
        flat_src = src.as_strided((src.untyped_storage().nbytes() // src.element_size(),), (1,), 0)
        flat_dst = dst.as_strided((dst.untyped_storage().nbytes() // dst.element_size(),), (1,), 0)
        flat_dst[dst.storage_offset() + d_off] = flat_src[src.storage_offset() + s_off].to(dst.dtype)


def _tensor(shape, dtype, device, gen):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool().to(device)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype).to(device)
    return torch.randint(-1000, 1000, shape, generator=gen).to(dtype).to(device)


FIELDS = ("seq_lens", "out_cache_loc", "positions", "topk_p", "topk_index", "req_pool_indices")


def runner_case(rng: random.Random, bs: int, topk: int, device: str, gen):
    """The draft graph runner's copy: static buffers (slices of bigger ones) <- this step's tensors."""
    width = topk * 3
    shapes = {"seq_lens": ((bs,), torch.int64), "out_cache_loc": ((bs * width,), torch.int64),
              "positions": ((bs * topk,), torch.int64), "topk_p": ((bs, topk), torch.float32),
              "topk_index": ((bs, topk), torch.int64), "req_pool_indices": ((bs,), torch.int64)}
    dsts, srcs = [], []
    for name in FIELDS:
        shape, dtype = shapes[name]
        big = torch.zeros((64 * max(1, shape[0]),) + shape[1:], dtype=dtype, device=device)
        dsts.append(big[: shape[0]])
        src_dtype = torch.int32 if dtype == torch.int64 and rng.random() < 0.3 else dtype  # a widening cast
        srcs.append(_tensor(shape, src_dtype, device, gen))
    return dsts, srcs


def edge_case(rng: random.Random, device: str, gen):
    """One of the operand lists try_small_copy's checks turn away (or must let through)."""
    kind = rng.choice(["alias", "alias_cast", "overlap_src", "overlap_dst", "neg", "grad", "big", "float_cast", "ndim3", "empty",
                       "col_stride", "transposed", "mixed_device" if device != "cpu" else "alias", "short"])
    a = torch.zeros(64, dtype=torch.int64, device=device)
    b = _tensor((8,), torch.int64, device, gen)
    dsts, srcs = [a[:8], torch.zeros(4, dtype=torch.float32, device=device)], [b, _tensor((4,), torch.float32, device, gen)]
    if kind == "alias":  # a dst copied onto itself: allowed
        dsts.append(a[16:24]); srcs.append(a[16:24])
    elif kind == "alias_cast":  # onto itself but read as another dtype: turned away
        dsts.append(a[16:24]); srcs.append(a[16:24].view(torch.int32)[:8])
    elif kind == "overlap_src":  # a dst overlapping another field's src
        dsts.append(a[20:28]); srcs.append(a[4:12])
    elif kind == "overlap_dst":
        dsts.append(a[4:12]); srcs.append(_tensor((8,), torch.int64, device, gen))
    elif kind == "neg":
        dsts.append(torch.zeros(3, device=device)); srcs.append(torch.ones(3, device=device)._neg_view())
    elif kind == "grad":
        dsts.append(torch.zeros(3, device=device)); srcs.append(torch.ones(3, device=device, requires_grad=True))
    elif kind == "big":
        dsts.append(torch.zeros(8193, device=device)); srcs.append(torch.ones(8193, device=device))
    elif kind == "float_cast":
        dsts.append(torch.zeros(3, device=device)); srcs.append(torch.ones(3, dtype=torch.float16, device=device))
    elif kind == "ndim3":
        dsts.append(torch.zeros(2, 2, 2, device=device)); srcs.append(torch.ones(2, 2, 2, device=device))
    elif kind == "empty":
        dsts.append(a[30:30]); srcs.append(b[:0])
    elif kind == "col_stride":  # a strided column: copied through its strides
        m = torch.zeros(6, 5, dtype=torch.int64, device=device)
        dsts.append(m[:, 1]); srcs.append(_tensor((6,), torch.int64, device, gen))
    elif kind == "transposed":  # rows overlapping their stride: turned away
        m = torch.zeros(4, 6, device=device)
        dsts.append(m.t()); srcs.append(torch.ones(6, 4, device=device))
    elif kind == "mixed_device":
        dsts.append(torch.zeros(3, device=device)); srcs.append(torch.ones(3))
    elif kind == "short":
        dsts, srcs = dsts[:1], srcs[:1]
    return kind, dsts, srcs


def cases(rng: random.Random, n: int, device: str):
    """``n`` operand lists: mostly runner copies (bs 1-8, topk 1-8), a quarter edge cases."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    for _ in range(n):
        if rng.random() < 0.25:
            yield edge_case(rng, device, gen)
        else:
            yield "runner", *runner_case(rng, rng.choice([1, 2, 4, 8]), rng.choice([1, 4, 8]), device, gen)


def run_on_copies(fn, dsts, srcs):
    """fn on copies of the operands that keep their aliasing (a dst that is a src stays one); its
    result and the dsts after it."""
    storages = {}

    def twin(t):
        storage = storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().clone())
        out = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.shape, t.stride())
        return out._neg_view() if t.is_neg() else out.requires_grad_(t.requires_grad)

    d2, s2 = [twin(t) for t in dsts], [twin(t) for t in srcs]
    return fn(d2, s2), [d.detach().clone() for d in d2]


def bump(srcs) -> None:
    """New contents, the same tensors (the same operand signature)."""
    for s in srcs:
        if not s.requires_grad and not s.is_neg() and s.dtype != torch.bool and s.numel():
            s.copy_(s + 1)
