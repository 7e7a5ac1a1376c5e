"""A deliberately wrong third-party slot, for showing that the e2e benchmark's
greedy-identity check can fail in a real server: ``perturb_kv`` adds 1e-3 to the
values written into layer 0's KV cache. Put this folder on PYTHONPATH and add an
arm ``--slots default,perturb_kv``; never selected unless named."""

from sglang_hostsync_plugin.hookspecs import hookimpl
from sglang_hostsync_plugin.slot import HookTarget, Slot, SlotKind, TargetKind

TARGET = "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.set_kv_buffer"


def perturbed_set_kv_buffer(original, self, layer, loc_info, cache_k, cache_v, *args, **kwargs):
    if getattr(layer, "layer_id", None) == 0:
        cache_v = cache_v + 1e-3
    return original(self, layer, loc_info, cache_k, cache_v, *args, **kwargs)


@hookimpl
def hostsync_slots():
    return [Slot(name="perturb_kv", kind=SlotKind.OWNED, origin="test", summary="WRONG on purpose: layer-0 KV values + 1e-3",
                 default=False, targets=(HookTarget(TARGET, TargetKind.FUNCTION, hook=perturbed_set_kv_buffer),))]
