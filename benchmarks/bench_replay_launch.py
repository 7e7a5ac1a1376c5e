"""triton_replay_launch: each of the plugin's Triton wrappers through Triton's JIT dispatch
("stock": the slot off) vs SGLang's ``replay_launches`` ("plugin": the slot on), one process,
same inputs (GPU): host µs per call (launch to return), GPU µs per call, syncs per call, and
``torch.argmax`` (what greedy_row_argmax replaces) for reference. spec_kernel_replay: each SGLang
wrapper it hooks, called directly ("stock") vs through the slot's ``Replay`` ("plugin"), each result
structure the EAGLE v2 step asks for. chain_tree_full_mask: SGLang's ``build_tree_kernel_efficient`` at topk 1
with the triton backend's full mask ("stock") vs the slot's hook, its launch replayed ("plugin").

    python benchmarks/bench_replay_launch.py [--rounds 4] [--json out.json]
"""

import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from per_call import compare, parse_args, print_rows, write_json  # noqa: E402

from hostsync_drivers import chain_tree, device_plan, eagle_tail, spec_wrappers, tree_compact  # noqa: E402
from sglang.srt.speculative import eagle_utils  # noqa: E402
from sglang_hostsync_plugin.slots import chain_tree_full_mask as ctf  # noqa: E402
from sglang_hostsync_plugin.slots import flashinfer_device_plan as fdp_slot  # noqa: E402
from sglang_hostsync_plugin.slots import fused_draft_page_locs as fdl  # noqa: E402
from sglang_hostsync_plugin.slots import fused_tree_compact as ftc  # noqa: E402
from sglang_hostsync_plugin.slots import greedy_row_argmax as gra  # noqa: E402
from sglang_hostsync_plugin.slots import spec_kernel_replay as skr  # noqa: E402
from sglang_hostsync_plugin.slots import triton_replay_launch as trl  # noqa: E402


def arms(fn):
    state = trl._wrappers  # switch_on() ran once in main(); an arm only flips the flag

    def off(_, *args):
        state.on = False
        return fn(*args)

    def on(_, *args):
        state.on = True
        return fn(*args)

    return {"stock": off, "plugin": on}


def main():
    ns = parse_args()
    trl.switch_on()
    rng = random.Random(3)
    rows = []
    for bs in (1, 8):
        x = torch.randn(bs * 8, 128256, device="cuda")
        res = compare({**arms(gra.row_argmax), "torch": lambda _, x: torch.argmax(x, dim=-1)}, None, (x,), ns)
        rows.append({"wrapper": "row_argmax", "bs": bs, **res})
        for hidden_dim, name in ((4096, "compact (EAGLE)"), (None, "compact (STANDALONE)")):
            c = tree_compact.make_case(rng, bs, 4, 3, hidden_dim=hidden_dim, device="cuda")
            args = (c["accept_index"], c["accept_lens"], c["out_cache_loc"], c["predict"], c["hidden"], c["bs"], c["nd"])
            rows.append({"wrapper": name, "bs": bs, **compare(arms(ftc.compact), None, args, ns)})
        _, (rt, base, last, pages) = eagle_tail.make_case(rng, bs, 4, 16, num_steps=3, device="cuda")
        args = (rt, torch.arange(bs, device="cuda"), (base + last).contiguous(), 4, 3, 16)
        rows.append({"wrapper": "page_locs_launch", "bs": bs, **compare(arms(fdl.page_locs_launch), None, args, ns)})
        for name, variants in spec_wrappers.VARIANTS:
            fn, replay = spec_wrappers.FUNCTIONS[name], skr.Replay(spec_wrappers.replayed(name))
            for variant in variants:
                args, kw = spec_wrappers.case(name, rng, bs, variant)
                calls = {"stock": lambda _, *a, fn=fn, kw=kw: fn(*a, **kw),
                         "plugin": lambda _, *a, fn=replay, kw=kw: fn(*a, **kw)}
                label = f"{name}{'/' + variant if variant else ''}"
                rows.append({"wrapper": label, "bs": bs, **compare(calls, None, args, ns)})
        args, _ = device_plan.prefill_launch(rng, bs)  # flashinfer_device_plan's prefill plan (verify, draft extend)
        rows.append({"wrapper": "launch_plan (device plan)", "bs": bs,
                     **compare(arms(fdp_slot.launch_plan), None, args, ns)})
        kw = chain_tree.make_case(rng, bs, 3, device="cuda")  # the triton backend's uint8 buffer, filled
        calls = {"stock": lambda _, kw=kw: eagle_utils.build_tree_kernel_efficient(**kw),
                 "plugin": lambda _, kw=kw: ctf.build_tree_hook(None, **kw)}
        rows.append({"wrapper": "chain_tree (topk 1, 3 steps)", "bs": bs, **compare(calls, None, (), ns)})
    trl.switch_off()
    print("host / GPU µs per call: stock = Triton's JIT dispatch, plugin = SGLang's replay_launches "
          "(spec_kernel_replay's rows: SGLang's wrapper, then through the slot's Replay; chain_tree: SGLang's "
          "build_tree_kernel_efficient, then chain_tree_full_mask's hook)")
    print_rows(rows, ("wrapper", "bs"))
    for r in rows:
        if "torch" in r:
            print(f"torch.argmax rows {r['bs'] * 8}: host {r['torch']['host_us_median']:.1f} µs, "
                  f"GPU {r['torch']['gpu_us_median']:.1f} µs")
    write_json(ns.json, rows)


if __name__ == "__main__":
    main()
