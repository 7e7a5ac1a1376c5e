"""The switch slots for SGLang 0.5.23's own metadata-prep opt-ins (metadata glue graph,
FlashInfer host plans): each inert rule against the server arguments, read through
SGLang's real argument preparation, the conditions still being in SGLang's code, and
the glue graph's conflict with the host-fed verify plan."""

import inspect

import pytest

from sglang_hostsync_plugin import config, registry
from sglang_hostsync_plugin.slot import ServingFacts
from sglang_hostsync_plugin.slots import upstream_host_plans as hp

CATALOGUE = registry.catalogue()


def facts(*argv):
    from sglang.srt.server_args import prepare_server_args

    return ServingFacts.from_server_args(prepare_server_args(["--model-path", "dummy", *argv]), {})


EAGLE = ("--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "dummy")


@pytest.mark.parametrize("argv, inert", [
    (EAGLE, None),
    ((*EAGLE, "--disable-cuda-graph"), "--disable-cuda-graph"),
    (("--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "dummy"), "DFlash family"),
    ((*EAGLE, "--enable-lora"), "LoRA"),
    ((), None),  # plain decode replays are glued too
])
def test_glue_graph_inert_rules(argv, inert):
    reason = hp.glue_inert(facts(*argv))
    assert (reason is None) if inert is None else (inert in reason), reason


@pytest.mark.parametrize("argv, inert", [
    ((*EAGLE, "--speculative-eagle-topk", "1", "--attention-backend", "flashinfer"), None),
    ((*EAGLE, "--speculative-eagle-topk", "1"), None),  # backend chosen later: not decided here
    ((*EAGLE, "--speculative-eagle-topk", "4", "--attention-backend", "flashinfer"), "topk is 4"),
    ((*EAGLE, "--speculative-eagle-topk", "1", "--attention-backend", "triton"), "not flashinfer"),
    ((*EAGLE, "--speculative-eagle-topk", "1", "--attention-backend", "flashinfer", "--kv-cache-dtype", "nvfp4"),
     "kv-cache-dtype is nvfp4"),
    (("--speculative-algorithm", "NGRAM", "--attention-backend", "flashinfer"), "only EAGLE-family"),
])
def test_verify_host_plan_inert_rules(argv, inert):
    reason = hp.verify_host_plan_inert(facts(*argv))
    assert (reason is None) if inert is None else (inert in reason), reason


@pytest.mark.parametrize("argv, inert", [
    ((*EAGLE, "--attention-backend", "flashinfer"), None),
    ((*EAGLE, "--attention-backend", "flashinfer", "--speculative-draft-window-size", "64"), "window-size is 64"),
    ((*EAGLE, "--attention-backend", "flashinfer", "--speculative-draft-attention-backend", "triton"),
     "draft attention backend is triton"),
    ((), "only the EAGLE multi-step draft"),
])
def test_draft_host_indptr_inert_rules(argv, inert):
    reason = hp.draft_host_indptr_inert(facts(*argv))
    assert (reason is None) if inert is None else (inert in reason), reason


def test_the_conditions_are_the_ones_in_sglang():
    from sglang.srt.layers.attention import flashinfer_backend as fb
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner as dcgr

    runner = inspect.getsource(dcgr.DecodeCudaGraphRunner)
    # The glue route and the DFlash force-off the glue rules mirror.
    for text in ("envs.SGLANG_ENABLE_METADATA_GLUE_GRAPH.get()", "model_runner.spec_algorithm.is_dflash_family()",
                 "and not self.enable_two_batch_overlap", "and not self.enable_pdmux",
                 "and self.model_runner.lora_manager is None", "and raw_bs == bs"):
        assert text in runner, text
    backend = inspect.getsource(fb)
    for text in ("envs.SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN.get()", "spec_info.topk == 1",
                 'self.prefill_backend == "fa2"', "self.dispatch_reason is None",
                 "envs.SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR.get()", "self.draft_window_size == 0"):
        assert text in backend, text


def test_glue_graph_and_host_fed_verify_plan_cannot_be_selected_together():
    with pytest.raises(config.HostsyncConfigError, match="conflict"):
        config.parse_slot_spec("default,metadata_glue_graph,flashinfer_verify_host_plan", CATALOGUE)
    assert "metadata_glue_graph" in config.parse_slot_spec("default,metadata_glue_graph", CATALOGUE).names
    for name in ("metadata_glue_graph", "flashinfer_verify_host_plan", "flashinfer_draft_host_indptr"):
        slot = CATALOGUE[name]
        assert not slot.default and slot.precheck() is None and name not in slot.presets
