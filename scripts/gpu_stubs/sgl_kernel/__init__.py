"""Import stub for sgl_kernel on the GPU test runner (the real wheel is 355 MiB and
cannot travel). Anything looked up imports fine; anything CALLED raises, so a test
that silently depended on an sgl_kernel op fails loudly instead of passing."""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+hostsync-stub"
CALLED: list[str] = []


class _Stub:
    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        CALLED.append(self._name)
        raise RuntimeError(f"sgl_kernel stub: {self._name} was called (real sgl_kernel not installed)")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self._name}.{attr}")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Stub(f"sgl_kernel.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []

        def getattr_(attr, _name=spec.name):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Stub(f"{_name}.{attr}")

        mod.__getattr__ = getattr_
        return mod

    def exec_module(self, module):
        pass


sys.meta_path.append(_Finder())
