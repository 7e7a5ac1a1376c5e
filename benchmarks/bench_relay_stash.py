"""fused_relay_stash: SGLang's ``FutureMap.stash`` ("stock") vs the slot's fused stash through
Triton's JIT dispatch ("plugin") and through SGLang's ``replay_launches`` ("replay",
``triton_replay_launch`` on, as in the ``eagle_host`` preset), on a real ``FutureMap`` on the GPU,
same payloads: host µs per call (launch to return), GPU µs, syncs per call.

    python benchmarks/bench_relay_stash.py [--rounds 4] [--json out.json]
"""

import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from per_call import compare, parse_args, print_rows, write_json  # noqa: E402

from hostsync_drivers.relay_stash import indices_for, make_maps, make_payload  # noqa: E402
from sglang.srt.managers.overlap_utils import FutureMap  # noqa: E402
from sglang_hostsync_plugin.slots import fused_relay_stash as frs  # noqa: E402
from sglang_hostsync_plugin.slots import triton_replay_launch as trl  # noqa: E402


def main():
    ns = parse_args()
    trl.switch_on()
    state = trl._wrappers
    rng = random.Random(5)
    rows = []
    with pytest.MonkeyPatch.context() as mp:
        for algo, hidden in (("STANDALONE", None), ("EAGLE", 4096)):
            for bs in (1, 8, 32):
                payload = make_payload(rng, bs, 4, hidden, device="cuda")
                stock_map, plugin_map = make_maps(rng, 256, payload, algo, device="cuda", monkeypatch=mp)
                idx = indices_for(rng, 256, bs, device="cuda")

                def fused(on):
                    def call(_, i, p):
                        state.on = on
                        frs.stash(plugin_map, i, p, plugin_map.stash)
                    return call

                calls = {"stock": lambda _, i, p: FutureMap.stash(stock_map, i, p), "plugin": fused(False),
                         "replay": fused(True)}
                rows.append({"algo": algo, "bs": bs, **compare(calls, None, (idx, payload), ns)})
    trl.switch_off()
    print("host / GPU µs per call: stock = FutureMap.stash, plugin = fused (JIT dispatch)")
    print_rows(rows, ("algo", "bs"))
    for r in rows:
        print(f"{r['algo']} bs {r['bs']}: fused with replay_launches: host {r['replay']['host_us_median']:.1f} µs, "
              f"GPU {r['replay']['gpu_us_median']:.1f} µs, syncs {r['replay']['syncs_per_call']}")
    write_json(ns.json, rows)


if __name__ == "__main__":
    main()
