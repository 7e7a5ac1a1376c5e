#!/usr/bin/env bash
# The GPU runs that open work waits for, as device calls of under 10 minutes each (one H100 or
# H200; any CUDA machine with SGLang 0.5.23 and FlashInfer 0.7.2 works the same). Each lands in
# $OUT (gpu_out/ elsewhere) as <name>.tar.xz; unpack into benchmarks/results/<date>-<gpu>[-<what>]/ with
# `python benchmarks/unpack_calls.py FOLDER CALL_OUTPUT...` (it prints what the folder's README needs).
#   CALL=1 bash scripts/device_pending.sh   # FlashInfer topk 1 / 4 page 16: stock, none (A/A), default, auto,
#                                           # real-traffic pass + 6 rounds c1/c8; GPU tests of the FlashInfer
#                                           # plan slots and the certified-plan port (no server)
#   CALL=2 bash scripts/device_pending.sh   # triton: NGRAM page 1, EAGLE3 topk 1 page 16, STANDALONE topk 4
#                                           # page 1 with stock, default, auto (+ eagle_host at page 1); then
#                                           # eagle_step_graph's GPU tests (no server)
#   CALL=2a / CALL=2b                       # CALL=2's NGRAM + EAGLE3 (2a, ~7 min) or NGRAM alone (2b, ~5 min)
#   CALL=3 bash scripts/device_pending.sh   # eagle_step_graph weight update / forced capture failures
#                                           # (benchmarks/step_graph_weights.py), then the NGRAM device-draft
#                                           # and the certified plan's server tests (the latter unregistered)
#   CALL=4 bash scripts/device_pending.sh   # DFlash and DSpark on the host-bound 1B-shaped dummy target: the
#                                           # audit's phase table (block phases, GPU-idle markers), stock code
#                                           # (before) vs default with the step graphs (after); the accept
#                                           # length dummy weights give their drafts
#   CALL=5 bash scripts/device_pending.sh   # FlashInfer topk 1 / 4 page 16: stock, `none` and `default` unaudited,
#                                           # `default,-event_ring`, auto: what `default`'s 1-3% below stock at
#                                           # topk 1 is (2026-12-06-h100-final), and topk 4's auto row
#   CALL=6 / CALL=6b bash scripts/device_pending.sh   # two slots' GPU tests whole, each with
#                                           # its real server: 6 ngram_device_draft incl. part 2 (triton NGRAM),
#                                           # 6b the certified plan's FlashInfer topk-1 e2e: what registering waits on
#   CALL=20 bash scripts/device_pending.sh  # under 8 minutes of device time: the replayed-launch GPU tests (the device
#                                           # plan's launch among them) and CALL=13's test (no server, ~5 min);
#                                           # CALL=20r the replayed launches alone (~2 min)
#   CALL=13 bash scripts/device_pending.sh  # issue 64's FlashInfer plan made on the device, against FlashInfer's
#                                           # planner (tests/test_gpu_flashinfer_device_plan.py; no server)
#   CALL=14 bash scripts/device_pending.sh  # the slot flashinfer_device_plan (not registered) in a real FlashInfer
#                                           # STANDALONE topk 1 page-16 server (topk 4: 14b): identity, real traffic,
#                                           # syncs per step and run-ahead against auto's set, 6 rounds c1/c8
#                                           # (tests/test_gpu_flashinfer_device_plan_slot.py)
#   CALL=14b bash scripts/device_pending.sh # the same at topk 4 on the 8B-shaped "llama-8b-bigram" target (its GPU
#                                           # step outlasts the host's: run-ahead >= 0.99 at c1, issue 64's bar)
#   CALL=15 bash scripts/device_pending.sh  # flashinfer_prefill_host_indptr in a real FlashInfer STANDALONE topk 4
#                                           # page-16 server beside auto's set: identity, no prefill plan() read-back
#                                           # (tests/test_gpu_flashinfer_prefill_host_indptr.py)
#   CALL=15q                                # CALL=15's identity, check line and sync sites alone (3 rounds, ~9 min)
#   CALL=7 bash scripts/device_pending.sh   # issue 63's combined topk-1 set (eagle_step_graph + the eagle_host
#                                           # slots that may run beside it) against each alone, EAGLE3 and
#                                           # STANDALONE topk 1 page 16 triton, real-traffic pass first
#   CALL=7b bash scripts/device_pending.sh  # CALL=7 again with a third set: the combined one without the slots that
#                                           # change the captured step's kernels (why combined is slower at c1)
#   CALL=7c bash scripts/device_pending.sh  # 7b's question on STANDALONE topk 1 page 16 alone (about 4 minutes)
#   CALL=8 bash scripts/device_pending.sh   # issue 65's benchmark: NGRAM page 1 triton on the e2e's "small-bigram"
#                                           # checkpoints, whose outputs repeat every 16 tokens (n-gram drafting has
#                                           # something to copy), stock vs auto's set (ngram_host) vs
#                                           # ngram_device_draft, real acceptance, 6 rounds
#                                           # c1/c8, audited arms and speed arms; then the slot's GPU tests whole,
#                                           # checking this e2e (CALL=6 runs them with an e2e of their own)
#   CALL=8c bash scripts/device_pending.sh  # the same workload on the "llama-8b-bigram" target (GPU step longer
#                                           # than the host's): stock, stock code, the device draft, ngram_host,
#                                           # audited: the run-ahead the 8-layer target could not show
#   CALL=8d bash scripts/device_pending.sh  # 8c's target unaudited (speed): stock, default, auto's NGRAM set
#                                           # (ngram_host), the device draft: is auto's NGRAM set below stock
#                                           # where the GPU step outlasts the host's (8c's audited arms read 0.945x)?
#   CALL=8e bash scripts/device_pending.sh  # NGRAM triton page 1, "small" checkpoints (drafts rarely accept): stock,
#                                           # auto (ngram_host's set), the same set named, the device draft's set
#   CALL=10s bash scripts/device_pending.sh # CALL=10's DSpark half alone with an `auto` arm (6 servers): its host
#                                           # work at c1, and auto's pick on a DSpark server;
#                                           # then eagle_step_graph's GPU tests (launch_graph)
#   CALL=10f bash scripts/device_pending.sh # DFlash p16 alone with an `auto` arm: auto's DFlash row on a GPU
#   CALL=19 bash scripts/device_pending.sh  # issue 64's run-ahead: py-spy on a FlashInfer topk-4 page-16 8B-shaped
#                                           # server (auto's set + the prefill slot, audited), c1: where the host's
#                                           # 6 ms per step goes; carry [".device-bundle-fi", ".devwheels"]
#   CALL=21 bash scripts/device_pending.sh  # issue 64's row, FlashInfer topk 4 page 16, 8B-shaped, with SGLang's
#                                           # default prefill CUDA graphs (every e2e before disabled them): stock, auto,
#                                           # auto + flashinfer_prefill_host_indptr (audited), 6 rounds c1/c8
#   CALL=16 bash scripts/device_pending.sh  # issue 63's triton STANDALONE topk 1 / 4 page 1 rows with an `auto` arm
#                                           # (stock, default, auto, default,eagle_host; at topk 4 the last is auto's pick)
#   CALL=17 bash scripts/device_pending.sh  # issue 63's FlashInfer STANDALONE topk 1 page 16 row again, 8 requests a c1
#                                           # round (stock, none, default, auto, auto + flashinfer_device_plan)
#   CALL=17s bash scripts/device_pending.sh # the same-code gap with the idle arms spinning, then asleep (--sleep-on-idle,
#                                           # the e2e's default since 2026-12-08): FlashInfer topk 1 page 16, ~8 min
#   CALL=18 bash scripts/device_pending.sh  # issue 63's triton STANDALONE topk 1 / 4 page 16 rows with an `auto` arm
#   CALL=9 / CALL=9b bash scripts/device_pending.sh  # issue 67's step graphs, each with its
#                                           # real server: 9 dflash_step_graph on dflash-p16, 9b dspark_step_graph
#                                           # on dspark-p16 (stock / default / the slot, self-check on)
#   CALL=11 / 11b / 11c bash scripts/device_pending.sh  # issue 63's matrix rows nobody measured: FlashInfer page 1
#                                           # (11: STANDALONE topk 1 / 4), FlashInfer NGRAM (11b, `ngram_host` audited
#                                           # too), triton STANDALONE
#                                           # topk 1 page 1 (11c): stock, default, each candidate set, and auto (which
#                                           # picks default there: an A/A pair, and auto's own never-below-stock row)
#   CALL=12 bash scripts/device_pending.sh  # issue 67's step graphs at accept length 3 (SGLANG_SIMULATE_ACC_LEN, integral,
#                                           # match-expected): multi-token accepts, which the random drafts never
#                                           # gave on 2026-12-07, under the eager self-check every 4th replay
#   CALL=10 bash scripts/device_pending.sh  # issue 67's must-show run: DFlash and DSpark p16, stock, stock code
#                                           # audited, default, both step graphs (each inert in the other's
#                                           # configuration) audited and not, real-traffic pass, 6 rounds c1/c8,
#                                           # on the "small-bigram" checkpoints, whose block drafts accept; the
#                                           # audited arms' phase tables with GPU-idle markers (stock code / after);
#                                           # the slots' eager self-check on every 32nd replay; then
#                                           # eagle_step_graph's GPU tests (the capture steps all three share)
# Calls 1-3 ran on 2026-12-06 (benchmarks/results/2026-12-06-h100-final/; call 1's topk-4 half and call 3's
# certified-plan e2e were cut by their limits). On 2026-12-07 (benchmarks/results/2026-12-07-h100/) 2 ran (its
# standalone-t4-p1 cut by the limit), 8 ran with the device draft's servers failing (a Req attribute, fixed
# since), 9 and 9b ran (their acceptance check failed: accept length 1.00; they now run on "small-bigram",
# whose block drafts are built to accept). 10, 8, 9 and 9b ran again (benchmarks/results/2026-12-07-h100-b/): 10's
# step-graph servers logged a capture's pool assert, fixed since. 10, 8c, 7, 11c and 11b (shorter) ran on the
# final code (benchmarks/results/2026-12-07-h100-c/). 10s, 8d and 8e ran, 7b failed (a log name too long, fixed since)
# and 11b with it (its ports were taken; benchmarks/results/2026-12-07-h100-d/). 13, 5 and CALL=14's topk-4 half ran
# (benchmarks/results/2026-12-07-h100-e/). 14b (cut once), 14, 14b and 7c ran (benchmarks/results/2026-12-07-h100-f/).
# 15q ran on a fresh machine and ended in FlashInfer's JIT, no verdict (benchmarks/results/2026-12-07-h100-g/).
# 2026-12-07 20:12-20:45 UTC: no machine lent (seven tries refused, then no machine lent for the rest of that session);
# 22:36-23:44 UTC the same (six refused, then too little device time left).
# 2026-12-08 01:20-01:42 UTC: 20, 17s, 15q and 19 ran (benchmarks/results/2026-12-08-h100/); 7c was cut.
# First on the next machine: 21 (issue 64's row with prefill CUDA graphs on; the prefill slot joins auto if identical);
# for issue 63 (each has an auto arm; `python benchmarks/auto_verdicts.py --matrix benchmarks/results/2026-12-0*`
# says which cells have no run of today's pick): 16, 18, 17, 11, 11b, 10f;
# 6b only if the certified plan is still wanted (the device plan supersedes it); 12 and 4 (67's extra evidence).
# The device tool: carry [".device-bundle-fi"], timeout 590, and start the next call within the
# machine's 30 s idle release. On a fresh machine FlashInfer's JIT holds a server's first request about 280 s
# (CUDA-graph capture 112 s, the first prefill's plan() 85 s; 2026-12-07-h100-g); later calls on the same machine
# find FlashInfer's JIT cache: expect the first FlashInfer call's budget to end it rounds early. Since 2026-12-07
# 20:41 UTC device_call.sh builds FlashInfer's attention modules in parallel beside the servers' load
# (scripts/flashinfer_attention_warm.py; about 110-150 s expected, not run yet: its log is in each archive).
# COMMON's c1 window is 8 requests since 2026-12-07 17:45 UTC (2 before: a c1 round timed two requests).
set -u
cd "$(dirname "$0")/.."
[ -n "${DRY_RUN:-}" ] || bash scripts/stop_stray_servers.sh  # before CALL=3's step_graph_weights, which starts servers too
# Issue 63's matrix rows time each round in passes (e2e --passes 4: c1 4 of 2 requests, c8 2 bursts of 8); the same
# code moved 0.62-1.14x by round with idle neighbours asleep (2026-12-08-h100, 17s). NGRAM calls keep one (its trie).
PASSES="--passes 4"
COMMON="--concurrency 1 8 --rounds 6 --requests 8 --max-new-tokens 64 --traffic-requests 48 --traffic-aborts 8 \
--server-arg=--disable-prefill-cuda-graph --ready-timeout 420"
case "${CALL:-}" in
  1)
    NAME=fi E2E_TIMEOUT=420 E2E_ARGS="--configs standalone-t1-p16,standalone-t4-p16 --attention-backend flashinfer \
--arms stock --slots none --slots default,-audit --slots auto,-audit $COMMON --time-budget 400" \
      GPU_TESTS="tests/test_gpu_flashinfer_plans.py $(for t in flashinfer_is_the_version_the_port_tracks \
the_port_equals_flashinfers_planner_on_cuda_graph_prefill_plans the_port_equals_flashinfers_planner_on_eager_plans \
the_port_equals_flashinfers_planner_on_tensor_core_draft_decode_plans a_certified_window_is_planned_by_flashinfer_exactly_as_its_hi \
the_slots_probe_self_checks_every_call_without_a_mismatch; do echo -n "tests/test_gpu_flashinfer_certified_plan.py::test_$t "; done)" \
      TESTS_TIMEOUT=110 bash scripts/device_call.sh ;;
  2)
    NAME=triton E2E_TIMEOUT=470 E2E_ARGS="--configs ngram-p1,eagle3-t1-p16,standalone-t4-p1 --arms stock \
--slots default,-audit --slots auto,-audit --slots default,eagle_host,-audit $COMMON --time-budget 450" \
      GPU_TESTS="tests/test_gpu_eagle_step_graph.py" TESTS_TIMEOUT=60 bash scripts/device_call.sh ;;
  2a)  # CALL=2's first two configurations, for a session with under 10 minutes of device time left
    NAME=triton E2E_TIMEOUT=400 E2E_ARGS="--configs ngram-p1,eagle3-t1-p16 --arms stock \
--slots default,-audit --slots auto,-audit --slots default,eagle_host,-audit $COMMON --time-budget 380" \
      bash scripts/device_call.sh ;;
  2b)  # CALL=2's NGRAM configuration alone (issue 61's final-code rerun, about 5 minutes)
    NAME=triton E2E_TIMEOUT=280 E2E_ARGS="--configs ngram-p1 --arms stock \
--slots default,-audit --slots auto,-audit --slots default,eagle_host,-audit $COMMON --time-budget 260" \
      bash scripts/device_call.sh ;;
  3)
    SGW_TIMEOUT=300 E2E_TIMEOUT=0 bash scripts/device_step_graph_weights.sh
    NAME=drafts GPU_TESTS="tests/test_gpu_ngram_device_draft.py tests/test_gpu_flashinfer_certified_plan.py" \
      TESTS_TIMEOUT=240 bash scripts/device_call.sh ;;
  4)
    NAME=blocks E2E_TIMEOUT=530 E2E_ARGS="--configs dflash-p16,dspark-p16 --weights dummy --dummy-shape llama-1b \
--arms stock,audit --slots default,dflash_step_graph,dspark_step_graph --plugin-env SGLANG_HOSTSYNC_AUDIT_MARKS=1 \
--concurrency 1 8 --rounds 3 --requests 2 --max-new-tokens 64 --server-arg=--disable-prefill-cuda-graph \
--ready-timeout 300 --time-budget 510" \
      bash scripts/device_call.sh ;;
  5)
    NAME=aa E2E_TIMEOUT=540 E2E_ARGS="--configs standalone-t1-p16,standalone-t4-p16 --attention-backend flashinfer \
--arms stock --slots none,-audit --slots default,-audit --slots default,-event_ring,-audit --slots auto,-audit \
--concurrency 1 8 --rounds 6 --requests 2 --max-new-tokens 64 --traffic-requests 48 --traffic-aborts 8 \
--server-arg=--disable-prefill-cuda-graph --ready-timeout 300 --time-budget 520" bash scripts/device_call.sh ;;
  6)
    NAME=ngram_draft GPU_TESTS="tests/test_gpu_ngram_device_draft.py" TESTS_TIMEOUT=560 bash scripts/device_call.sh ;;
  20)  # a short budget's most needed check: the plugin's replayed launches (the device plan's, in auto's FlashInfer
        # topk > 1 set, first ran there without one) and the device plan against FlashInfer's planner; no server
    NAME=replay_plan GPU_TESTS="tests/test_gpu_triton_replay_launch.py tests/test_gpu_flashinfer_device_plan.py" \
      TESTS_TIMEOUT=300 bash scripts/device_call.sh ;;
  20r)  # CALL=20's replayed launches alone (the device plan's among them), for the last 4-5 minutes of device time
    NAME=replay GPU_TESTS="tests/test_gpu_triton_replay_launch.py" TESTS_TIMEOUT=120 \
      bash scripts/device_call.sh ;;
  13)  # issue 64's device plan against FlashInfer's own planner (no server; about a minute after the bundle)
    NAME=device_plan GPU_TESTS="tests/test_gpu_flashinfer_device_plan.py" TESTS_TIMEOUT=240 bash scripts/device_call.sh ;;
  14)
    NAME=device_plan_t1 HOSTSYNC_DEVICE_PLAN_CONFIGS=standalone-t1-p16 \
      GPU_TESTS="tests/test_gpu_flashinfer_device_plan_slot.py" TESTS_TIMEOUT=560 bash scripts/device_call.sh ;;
  14b)
    NAME=device_plan_8b HOSTSYNC_DEVICE_PLAN_CONFIGS=standalone-t4-p16 HOSTSYNC_DEVICE_PLAN_SHAPE=llama-8b-bigram \
      FI_WARM_SHAPE=llama-8b-bigram \
      GPU_TESTS="tests/test_gpu_flashinfer_device_plan_slot.py" TESTS_TIMEOUT=560 bash scripts/device_call.sh ;;
  15)  # flashinfer_prefill_host_indptr beside auto's FlashInfer topk-4 set: identity, no prefill plan() read-back
    # (first, about 30 s: the device plan's launch replayed as the plain launch, which this call's arms run)
    NAME=prefill_host_indptr TESTS_TIMEOUT=560 GPU_TESTS="\
tests/test_gpu_triton_replay_launch.py::test_replayed_launches_return_the_plain_wrappers_results[launch_plan] \
tests/test_gpu_flashinfer_prefill_host_indptr.py" \
      bash scripts/device_call.sh ;;
  15q)  # CALL=15 for a session with under 10 minutes of device time: stock and the two audited arms, 3 rounds
    NAME=prefill_host_indptr_q HOSTSYNC_PREFILL_QUICK=1 GPU_TESTS="\
tests/test_gpu_triton_replay_launch.py::test_replayed_launches_return_the_plain_wrappers_results[launch_plan] \
tests/test_gpu_flashinfer_prefill_host_indptr.py" \
      TESTS_TIMEOUT=480 bash scripts/device_call.sh ;;
  6b)
    NAME=cert_plan FI_WARM_SHAPE=llama-1b GPU_TESTS="tests/test_gpu_flashinfer_certified_plan.py" TESTS_TIMEOUT=560 \
      bash scripts/device_call.sh ;;
  7)
    COMBINED=default,eagle_step_graph,eagle_host,-metadata_glue_graph,-draft_extend_glue_graph,\
-draft_decode_glue_graph,-draft_extend_topk_graph
    NAME=t1set E2E_TIMEOUT=540 E2E_ARGS="--configs eagle3-t1-p16,standalone-t1-p16 --arms stock \
--slots default,eagle_step_graph,-audit --slots $COMBINED,-audit --slots default,eagle_host,-audit $COMMON \
--time-budget 520" bash scripts/device_call.sh ;;
  7b)  # why the combined set is slower at c1 (2026-12-07-h100-c): without the slots that change what the step graph
       # captures (fused or triton kernels in place of SGLang's ops), only those that cut eager steps' host work
    COMBINED=default,eagle_step_graph,eagle_host,-metadata_glue_graph,-draft_extend_glue_graph,\
-draft_decode_glue_graph,-draft_extend_topk_graph
    HOST_ONLY=$COMBINED,-fused_draft_page_locs,-fused_relay_stash,-fused_tree_compact,-greedy_row_argmax,\
-draft_vocab_topk,-chain_tree_full_mask
    NAME=t1set_b E2E_TIMEOUT=540 E2E_ARGS="--configs eagle3-t1-p16,standalone-t1-p16 --arms stock \
--slots default,eagle_step_graph,-audit --slots $COMBINED,-audit --slots $HOST_ONLY,-audit $COMMON \
--time-budget 520" bash scripts/device_call.sh ;;
  7c)  # 7b's question on STANDALONE topk 1 page 16 alone (where the combined set read 0.883x the step graph at c1),
       # for a session with about 4 minutes of device time: stock, the step graph, the host-only combined set
    HOST_ONLY=default,eagle_step_graph,eagle_host,-metadata_glue_graph,-draft_extend_glue_graph,-draft_decode_glue_graph,\
-draft_extend_topk_graph,-fused_draft_page_locs,-fused_relay_stash,-fused_tree_compact,-greedy_row_argmax,\
-draft_vocab_topk,-chain_tree_full_mask
    NAME=t1set_c E2E_TIMEOUT=200 E2E_ARGS="--configs standalone-t1-p16 --arms stock --slots default,eagle_step_graph,-audit \
--slots $HOST_ONLY,-audit $COMMON --time-budget 185" bash scripts/device_call.sh ;;
  8)  # the copying workload (small-bigram: outputs repeat every 16 tokens); audited arms (syncs, run-ahead) and
      # unaudited ones (speed); then the slot's GPU tests check this e2e
    NAME=ngram_copy E2E_TIMEOUT=460 E2E_ARGS="--configs ngram-p1 \
--checkpoint-shape small-bigram --arms stock,audit --slots default,ngram_full_mask \
--slots default,ngram_full_mask,ngram_device_draft --slots default,eagle_host,ngram_host \
--slots default,eagle_host,ngram_host,-audit --slots default,eagle_host,ngram_full_mask,ngram_device_draft,-audit \
$COMMON --max-new-tokens 128 --time-budget 440" \
      HOSTSYNC_NGRAM_E2E_DIR=/tmp/hostsync-ngram_copy/run/e2e GPU_TESTS="tests/test_gpu_ngram_device_draft.py" \
      TESTS_TIMEOUT=85 bash scripts/device_call.sh ;;
  8c)  # NGRAM's copying workload on an 8B-shaped target, whose GPU step outlasts the host's: can the host run ahead
       # with the device draft? Four 15 GB servers on one GPU (audited arms: the run-ahead is the audit's)
    NAME=ngram_8b E2E_TIMEOUT=520 E2E_ARGS="--configs ngram-p1 --checkpoint-shape llama-8b-bigram --arms stock,audit \
--slots default,ngram_full_mask,ngram_device_draft --slots default,eagle_host,ngram_host $COMMON --max-new-tokens 128 \
--ready-timeout 420 --time-budget 500" bash scripts/device_call.sh ;;
  8d)
    NAME=ngram_8b_speed E2E_TIMEOUT=520 E2E_ARGS="--configs ngram-p1 --checkpoint-shape llama-8b-bigram --arms stock \
--slots default,-audit --slots default,eagle_host,ngram_host,-audit \
--slots default,eagle_host,ngram_full_mask,ngram_device_draft,-audit $COMMON --max-new-tokens 128 \
--ready-timeout 420 --time-budget 500" bash scripts/device_call.sh ;;
  8e)  # NGRAM triton page 1 on the "small" checkpoints (no copying: accept length ~1): does the device draft, which
       # loses SGLang's cross-request trie, stay ahead of auto's NGRAM set where drafts rarely accept?
    NAME=ngram_small E2E_TIMEOUT=400 E2E_ARGS="--configs ngram-p1 --arms stock --slots auto,-audit \
--slots default,eagle_host,ngram_host,-audit --slots default,eagle_host,ngram_full_mask,ngram_device_draft,-audit \
$COMMON --time-budget 380" bash scripts/device_call.sh ;;
  10s)
    GRAPHS=default,dflash_step_graph,dspark_step_graph
    NAME=dspark_graph_e2e E2E_TIMEOUT=400 E2E_ARGS="--configs dspark-p16 --checkpoint-shape small-bigram \
--arms stock,audit --slots default,-audit --slots auto,-audit --slots $GRAPHS,-audit --slots $GRAPHS \
--plugin-env SGLANG_HOSTSYNC_AUDIT_MARKS=1 --plugin-env SGLANG_HOSTSYNC_STEP_GRAPH_CHECK=32 $COMMON \
--time-budget 380" GPU_TESTS="tests/test_gpu_eagle_step_graph.py" TESTS_TIMEOUT=60 bash scripts/device_call.sh ;;
  10f)  # CALL=10's DFlash half alone with an `auto` arm (auto's DFlash row never ran on a GPU): stock, default, auto,
        # the step graph, unaudited, the self-check every 32nd replay
    NAME=dflash_auto E2E_TIMEOUT=400 E2E_ARGS="--configs dflash-p16 --checkpoint-shape small-bigram --arms stock \
--slots default,-audit --slots auto,-audit --slots default,dflash_step_graph,-audit \
--plugin-env SGLANG_HOSTSYNC_STEP_GRAPH_CHECK=32 $COMMON $PASSES --time-budget 380" bash scripts/device_call.sh ;;
  10)  # each step graph is inert in the other's configuration, so one arm holds both; the eager self-check every 32nd
      # replay (its eager step counts in the arm's host work and speed: against the slots, by about 1/32 of a step)
    GRAPHS=default,dflash_step_graph,dspark_step_graph
    # then eagle_step_graph's GPU tests: the capture steps and pool rule all three step graphs share
    NAME=block_graphs E2E_TIMEOUT=480 E2E_ARGS="--configs dflash-p16,dspark-p16 --checkpoint-shape small-bigram \
--arms stock,audit --slots default,-audit --slots $GRAPHS,-audit --slots $GRAPHS \
--plugin-env SGLANG_HOSTSYNC_AUDIT_MARKS=1 \
--plugin-env SGLANG_HOSTSYNC_STEP_GRAPH_CHECK=32 $COMMON --time-budget 460" \
      GPU_TESTS="tests/test_gpu_eagle_step_graph.py" TESTS_TIMEOUT=60 bash scripts/device_call.sh ;;
  12)  # the self-check's mismatch counts are in each server log's last check line (the e2e's "Slot self-checks")
    NAME=graphs_sim E2E_TIMEOUT=420 E2E_ARGS="--configs dflash-p16,dspark-p16 --simulate-acc-len 3 --arms stock \
--slots default --slots default,dflash_step_graph,dspark_step_graph --plugin-env SGLANG_HOSTSYNC_STEP_GRAPH_CHECK=4 \
--concurrency 1 4 --rounds 2 --requests 2 --max-new-tokens 128 --traffic off --top-logprobs 0 \
--server-arg=--disable-prefill-cuda-graph --ready-timeout 300 --time-budget 400" \
      bash scripts/device_call.sh ;;
  11)
    NAME=fi_p1 E2E_TIMEOUT=545 E2E_ARGS="--configs standalone-t1-p1,standalone-t4-p1 --attention-backend flashinfer \
--arms stock --slots default,-audit --slots auto,-audit --slots default,flashinfer,eagle_host,-metadata_glue_graph,-audit \
$COMMON $PASSES --time-budget 525" bash scripts/device_call.sh ;;
  11b)  # `ngram_host`'s set audited too: the FlashInfer NGRAM row's one sync per step (flashinfer-bound-plan.md, 10;
         # `auto` picks `default` there, whose one wait is at the seq-lens resolve)
    NAME=fi_ngram E2E_TIMEOUT=545 E2E_ARGS="--configs ngram-p1 --attention-backend flashinfer --arms stock \
--slots default,-audit --slots auto,-audit --slots default,eagle_host,ngram_host,-audit \
--slots default,eagle_host,ngram_host $COMMON --time-budget 525" bash scripts/device_call.sh ;;
  11c)
    NAME=t1p1 E2E_TIMEOUT=545 E2E_ARGS="--configs standalone-t1-p1 --arms stock --slots default,-audit \
--slots auto,-audit --slots default,eagle_host,-audit --slots default,eagle_step_graph,-audit $COMMON --time-budget 525" \
      bash scripts/device_call.sh ;;
  19)  # issue 64's run-ahead: where FlashInfer's host work per step goes (section 9 of docs/flashinfer-bound-plan.md),
        # py-spy on the schedulers (carry .devwheels with py-spy.xz: `pip download py-spy --no-deps`, strip, xz -9e),
        # topk 4 page 16 on the 8B-shaped target, auto's set with the prefill slot, audited: its syncs and run-ahead too
        # then the replay-launch GPU tests (the device plan's launch joined them on 2026-12-07)
    NAME=fi_profile PYSPY_CONFIGS=standalone-t4-p16 E2E_TIMEOUT=480 E2E_ARGS="--configs standalone-t4-p16 \
--attention-backend flashinfer --checkpoint-shape llama-8b-bigram --arms stock \
--slots default,flashinfer,eagle_host,-metadata_glue_graph,flashinfer_device_plan,flashinfer_prefill_host_indptr \
--concurrency 1 --rounds 4 --requests 8 --max-new-tokens 64 --traffic-requests 16 --traffic-aborts 4 \
--server-arg=--disable-prefill-cuda-graph --ready-timeout 420 --time-budget 450" \
      GPU_TESTS="tests/test_gpu_triton_replay_launch.py" TESTS_TIMEOUT=60 bash scripts/device_call.sh ;;
  21)  # issue 64's bar with SGLang's default breakable prefill graphs (~45 s more start): is the prefill slot identical
        # there (what auto waits on), and do steps 1-3 after a prefill still miss (2026-12-08-h100: all 15 misses)?
    NAME=fi_bar E2E_TIMEOUT=540 E2E_ARGS="--configs standalone-t4-p16 --attention-backend flashinfer \
--checkpoint-shape llama-8b-bigram --arms stock --slots auto --slots auto,flashinfer_prefill_host_indptr \
--concurrency 1 8 --rounds 6 --requests 8 --max-new-tokens 64 --traffic-requests 48 --traffic-aborts 8 \
$PASSES --ready-timeout 420 --time-budget 520" bash scripts/device_call.sh ;;
  16)  # issue 63's triton page-1 rows as `auto` arms (auto picks the step graph at topk 1, eagle_host at topk 4)
    NAME=triton_p1 E2E_TIMEOUT=545 E2E_ARGS="--configs standalone-t1-p1,standalone-t4-p1 --arms stock \
--slots default,-audit --slots auto,-audit --slots default,eagle_host,-audit $COMMON $PASSES --time-budget 525" \
      bash scripts/device_call.sh ;;
  17s)  # is the same-code gap the idle arms' spinning? FlashInfer STANDALONE topk 1 page 16, stock / none / auto, 4
         # rounds, no traffic pass: first with --no-sleep-on-idle (the idle arms spin, as in every run before
         # 2026-12-08), then with it (the e2e's default); compare none/stock's spread and others_cpus
    # (the first run may wait on FlashInfer's JIT: 300 s; the second gets what is left of 560, each archive its own)
    for S in spin sleep; do
      T=$([ $S = spin ] && echo 300 || echo $((560 - SECONDS)))
      NAME=idle_$S E2E_TIMEOUT=$T E2E_ARGS="--configs standalone-t1-p16 --attention-backend flashinfer --arms stock \
--slots none,-audit --slots auto,-audit --concurrency 1 8 --rounds 4 --requests 8 --requests-per-user 4 \
--max-new-tokens 64 --traffic off --server-arg=--disable-prefill-cuda-graph --ready-timeout $((T - 30)) \
--time-budget $((T - 20)) $([ $S = spin ] && echo --no-sleep-on-idle)" bash scripts/device_call.sh
    done ;;
  17)  # issue 63's FlashInfer topk-1 page-16 row again (2026-12-07-h100-e read auto 0.986x / 0.920x stock, lowest
        # round 0.668, with `none` 0.871x at c1: two requests a c1 round): stock, none, default, auto, auto + device plan;
        # a c8 window of 32 requests (16 lasted 0.6 s there; its lowest round was one window)
    NAME=fi_t1 E2E_TIMEOUT=400 E2E_ARGS="--configs standalone-t1-p16 --attention-backend flashinfer --arms stock \
--slots none,-audit --slots default,-audit --slots auto,-audit \
--slots default,flashinfer,eagle_host,-metadata_glue_graph,flashinfer_device_plan,-audit $COMMON --requests-per-user 4 \
$PASSES --time-budget 380" \
      bash scripts/device_call.sh ;;
  18)  # issue 63's triton page-16 STANDALONE rows as `auto` arms (never run as one): auto picks the step graph at
        # topk 1, eagle_host at topk 4 (there the last arm is its pick: an A/A pair)
    NAME=triton_p16 E2E_TIMEOUT=545 E2E_ARGS="--configs standalone-t1-p16,standalone-t4-p16 --arms stock \
--slots default,-audit --slots auto,-audit --slots default,eagle_host,-audit $COMMON $PASSES --time-budget 525" \
      bash scripts/device_call.sh ;;
  9)
    NAME=dflash_graph GPU_TESTS="tests/test_gpu_block_step_graph.py -k dflash" TESTS_TIMEOUT=575 bash scripts/device_call.sh ;;
  9b)
    NAME=dspark_graph GPU_TESTS="tests/test_gpu_block_step_graph.py -k dspark" TESTS_TIMEOUT=575 bash scripts/device_call.sh ;;
  *)
    sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 2 ;;
esac
