"""Host cost of each torch/CUDA operation the DP-meta fills are made of (stock and
staged), on the GPU: why the stager issues its copies and event record from csrc.
Usage: python benchmarks/profile_staging_ops.py"""
import statistics, time, random, ctypes
import torch
from sglang.srt.speculative.spec_info import spec_scale_global_num_tokens
from types import SimpleNamespace

N = 3000
def t(name, fn):
    for _ in range(300): fn()
    ts = []
    for _ in range(N):
        t0 = time.perf_counter_ns(); fn(); ts.append(time.perf_counter_ns() - t0)
    torch.cuda.synchronize()
    print(f"{name:40s} med {statistics.median(ts)/1e3:7.2f} us  p90 {statistics.quantiles(ts, n=10)[8]/1e3:7.2f}")

for dp in (8, 32):
    print("dp", dp)
    gnt = [random.randint(0, 64) for _ in range(dp)]; gl = [random.randint(0, 8) for _ in range(dp)]
    host = torch.zeros((2, 2, dp), dtype=torch.int64, pin_memory=True); hnp = host.numpy()
    dev = torch.zeros((2, 2, dp), dtype=torch.int64, device="cuda")
    hs, ds = host[0], dev[0]
    ev = torch.cuda.Event(); ev.record()
    nnp = torch.zeros((1,), dtype=torch.int32, device="cuda")
    si = SimpleNamespace(num_tokens_per_req=4, num_tokens_for_logprob_per_req=1)
    def np_write(): hnp[0, 0] = gnt; hnp[0, 1] = gl
    t("numpy write 2 rows", np_write)
    def np_write_arr(): hnp[0] = (gnt, gl)
    t("numpy write [rows] at once", np_write_arr)
    t("copy_ non_blocking", lambda: ds.copy_(hs, non_blocking=True))
    t("event.record()", lambda: ev.record())
    t("event.query()", lambda: ev.query())
    t("current_stream()", lambda: torch.cuda.current_stream())
    t("nnp.fill_", lambda: nnp.fill_(37))
    t("spec_scale", lambda: spec_scale_global_num_tokens(si, gnt, gl))
    t("row views dev[0,0],dev[0,1]", lambda: (dev[0, 0], dev[0, 1]))
    t("stock torch.tensor pinned", lambda: torch.tensor(gnt, dtype=torch.int64, pin_memory=True))
    t("stock tensor pinned + .to", lambda: torch.tensor(gnt, dtype=torch.int64, pin_memory=True).to("cuda", non_blocking=True))
    t("torch.empty device [2,dp]", lambda: torch.empty((2, dp), dtype=torch.int64, device="cuda"))
    cudart = None
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            cudart = ctypes.CDLL(name); break
        except OSError:
            pass
    if cudart is None:
        import glob, os
        cand = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcudart.so*"))
        if cand: cudart = ctypes.CDLL(cand[0])
    if cudart is not None:
        fnm = cudart.cudaMemcpyAsync
        fnm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        dptr, hptr, nb = ds.data_ptr(), hs.data_ptr(), hs.numel() * 8
        sp = torch.cuda.current_stream().cuda_stream
        t("ctypes cudaMemcpyAsync (cached ptrs)", lambda: fnm(dptr, hptr, nb, 1, sp))
        t("ctypes memcpy + stream lookup", lambda: fnm(dptr, hptr, nb, 1, torch.cuda.current_stream().cuda_stream))
    else:
        print("no libcudart found for ctypes")
