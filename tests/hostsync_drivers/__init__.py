"""Stock-vs-plugin drivers: each owned slot's SGLang code path on real SGLang 0.5.23
objects (built without their model-loading ``__init__`` where needed). The tests and
``benchmarks/bench_decode_loop.py`` share them. Importing a driver imports SGLang."""


class Patcher:
    """``setattr`` with undo; pytest's ``monkeypatch`` fixture fits the same slot."""

    def __init__(self):
        self._undo = []

    def setattr(self, obj, name, value):
        self._undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def undo(self):
        while self._undo:
            obj, name, value = self._undo.pop()
            setattr(obj, name, value)


class CallCounter:
    """Counts calls of ``owner.name`` (e.g. ``torch.empty``) while ``on``, those whose
    keyword arguments satisfy ``when`` if given. ``patcher``: a Patcher or monkeypatch."""

    def __init__(self, patcher, owner, name, when=None, on=True):
        self.on = on
        self.n = 0
        real = getattr(owner, name)

        def counting(*args, **kwargs):
            if self.on and (when is None or when(kwargs)):
                self.n += 1
            return real(*args, **kwargs)

        patcher.setattr(owner, name, counting)


def count_pinned_allocations(patcher, on=False) -> CallCounter:
    import torch

    return CallCounter(patcher, torch, "empty", when=lambda kwargs: bool(kwargs.get("pin_memory")), on=on)


def abba(arms: dict, rounds: int) -> dict:
    """Call each of ``arms`` (name -> no-argument callable) ``rounds`` times, the order
    reversed every round (A B, B A, A B, ...), so a drift in host speed hits every arm
    alike. Returns name -> the list of its results."""
    names = list(arms)
    out = {name: [] for name in names}
    for k in range(rounds):
        for name in (names if k % 2 == 0 else names[::-1]):
            out[name].append(arms[name]())
    return out
