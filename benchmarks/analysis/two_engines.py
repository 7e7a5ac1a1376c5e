# benchmarks/results/2026-12-04-cpu-engine/ (README and out.txt there; until 2026-12-06 this script lived
# there): three embedded Engines' launcher gates in one process, same server args, each call's time.
#   SGLANG_ENABLE_HOSTSYNC_PLUGIN=1 SGLANG_HOSTSYNC_SLOTS=default,eagle_host TRITON_INTERPRET=1 python benchmarks/analysis/two_engines.py
import json, os, sys, time
from sglang.srt.entrypoints import engine
try:
    engine.Engine(not_a_server_arg=1)
except TypeError:
    pass
from sglang.srt.server_args import ServerArgs
for i in range(3):
    sa = ServerArgs(model_path="dummy", device="cpu", attention_backend="triton", speculative_algorithm="STANDALONE",
                    speculative_draft_model_path="dummy", speculative_eagle_topk=4, speculative_num_steps=3,
                    speculative_num_draft_tokens=8, page_size=16)
    t = time.perf_counter(); engine._set_envs_and_config(sa); print(f"engine {i}: gate + set-up {time.perf_counter() - t:.3f} s")
