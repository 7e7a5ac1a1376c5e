"""Probe for a topk-1 step-graph runner (docs/host-work.md, design notes): can one CUDA graph hold
already-captured graphs, so SGLang's three runner graphs and the eager glue between them replay as one?

Checks, on the current GPU, with torch's own ``CUDAGraph``:

1. ``child-in-capture``: ``a.replay()`` issued while graph ``b`` captures. Does the capture succeed, and does
   replaying ``b`` run ``a``'s work (as a child graph node) in stream order with ``b``'s own kernels?
2. ``keep-graph``: ``CUDAGraph(keep_graph=True)`` and ``raw_cuda_graph()`` (the ``cudaGraph_t`` a parent
   graph could add with ``cudaGraphAddChildGraphNode``).
3. ``launch-in-capture``: the driver's ``cuGraphLaunch`` of ``a`` on the stream while ``b`` captures.
4. ``child-nodes``: a parent graph built by hand (``cuGraphAddChildGraphNode``) from two kept graphs.
5. Host µs per replay or launch of the composed graph against its parts launched one by one.

    python benchmarks/probe_child_graph.py

Prints one line per check; exits 0 whatever the answers (it reports, it does not assert).
"""

import time

import torch


def child_in_capture(n_kernels: int = 8):
    x = torch.zeros(16, device="cuda")
    y = torch.zeros(16, device="cuda")
    a = torch.cuda.CUDAGraph()
    with torch.cuda.graph(a):
        for _ in range(n_kernels):
            x.add_(1)
    b = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(b, pool=a.pool()):
            a.replay()
            y.add_(x)  # reads a's result: stream order inside b
            x.mul_(2)
    except Exception as exc:  # noqa: BLE001 (the answer is the exception)
        print(f"child-in-capture: capture FAILED: {type(exc).__name__}: {exc}")
        return None
    x.zero_()
    y.zero_()
    torch.cuda.synchronize()
    b.replay()
    torch.cuda.synchronize()
    first = (x[0].item(), y[0].item())
    b.replay()
    torch.cuda.synchronize()
    second = (x[0].item(), y[0].item())
    # With a inside b: (x, y) = (2n, n) after one replay, (2(2n + n), n + 3n) after two.
    want = ((2 * n_kernels, n_kernels), (2 * (2 * n_kernels + n_kernels), n_kernels + 3 * n_kernels))
    print(f"child-in-capture: captured; after 1 and 2 replays (x, y) = {first}, {second}; "
          f"expected with a's work inside b {want}: {'YES' if (first, second) == want else 'NO'}")
    return a, b, x, y


def keep_graph():
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError as exc:
        print(f"keep-graph: not supported by this torch ({exc})")
        return
    x = torch.zeros(4, device="cuda")
    with torch.cuda.graph(g):
        x.add_(1)
    raw = g.raw_cuda_graph()
    g.instantiate()
    g.replay()
    torch.cuda.synchronize()
    print(f"keep-graph: raw_cuda_graph() = {raw!r}; replay after instantiate gives x = {x[0].item()}")


def driver():
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    for name in ("cuGraphLaunch", "cuGraphCreate", "cuGraphAddChildGraphNode", "cuGraphInstantiateWithFlags"):
        getattr(lib, name).restype = ctypes.c_int
    return lib, ctypes


def launch_in_capture(n_kernels: int = 8):
    """torch refuses ``replay()`` while capturing; the driver's ``cuGraphLaunch`` on the capturing stream."""
    lib, ct = driver()
    x = torch.zeros(16, device="cuda")
    y = torch.zeros(16, device="cuda")
    a = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(a):
        for _ in range(n_kernels):
            x.add_(1)
    a.instantiate()
    b = torch.cuda.CUDAGraph()
    with torch.cuda.graph(b, pool=a.pool()):
        rc = lib.cuGraphLaunch(ct.c_void_p(a.raw_cuda_graph_exec()), ct.c_void_p(torch.cuda.current_stream().cuda_stream))
        y.add_(x)
        x.mul_(2)
    x.zero_()
    y.zero_()
    b.replay()
    torch.cuda.synchronize()
    got = (x[0].item(), y[0].item())
    print(f"launch-in-capture: cuGraphLaunch rc {rc}; after one replay (x, y) = {got}, with a's work inside b "
          f"{(2 * n_kernels, n_kernels)}: {'YES' if got == (2 * n_kernels, n_kernels) else 'NO'}")


def child_nodes(n_kernels: int = 8):
    """A parent graph built by hand from two kept graphs as child nodes, the second after the first."""
    lib, ct = driver()
    x = torch.zeros(16, device="cuda")
    y = torch.zeros(16, device="cuda")
    a = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(a):
        for _ in range(n_kernels):
            x.add_(1)
    c = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(c, pool=a.pool()):
        y.add_(x)
        x.mul_(2)
    parent, first, second, exe = ct.c_void_p(), ct.c_void_p(), ct.c_void_p(), ct.c_void_p()
    rcs = [lib.cuGraphCreate(ct.byref(parent), 0),
           lib.cuGraphAddChildGraphNode(ct.byref(first), parent, None, 0, ct.c_void_p(a.raw_cuda_graph())),
           lib.cuGraphAddChildGraphNode(ct.byref(second), parent, ct.byref(first), 1, ct.c_void_p(c.raw_cuda_graph())),
           lib.cuGraphInstantiateWithFlags(ct.byref(exe), parent, 0)]
    stream = ct.c_void_p(torch.cuda.current_stream().cuda_stream)
    x.zero_()
    y.zero_()
    rcs.append(lib.cuGraphLaunch(exe, stream))
    torch.cuda.synchronize()
    got = (x[0].item(), y[0].item())
    print(f"child-nodes: driver rcs {rcs}; after one launch (x, y) = {got}, expected {(2 * n_kernels, n_kernels)}: "
          f"{'YES' if got == (2 * n_kernels, n_kernels) else 'NO'}")
    if all(r == 0 for r in rcs):
        print(f"host µs per launch: parent {host_us(lambda: lib.cuGraphLaunch(exe, stream)):.1f}, "
              f"a.replay() + c.replay() {host_us(lambda: (a.replay(), c.replay())):.1f}")


def host_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    per = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return per


def main():
    print(f"torch {torch.__version__}, CUDA runtime {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
    got = child_in_capture()
    keep_graph()
    for probe in (launch_in_capture, child_nodes):
        try:
            probe()
        except Exception as exc:  # noqa: BLE001 (the answer is the exception)
            print(f"{probe.__name__}: FAILED: {type(exc).__name__}: {exc}")
    if got is not None:
        a, b, x, y = got

        def eager():
            a.replay()
            y.add_(x)
            x.mul_(2)

        for _ in range(2):
            print(f"host µs per call: b.replay() {host_us(b.replay):.1f}, a.replay() + 2 eager kernels "
                  f"{host_us(eager):.1f}, a.replay() {host_us(a.replay):.1f}")


if __name__ == "__main__":
    main()
