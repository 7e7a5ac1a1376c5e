"""checks.package_file_pins: a non-Python file inside an installed package, pinned by its hash."""

import hashlib
import importlib
import sys

from sglang_hostsync_plugin.checks import package_file_pins


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _portion(root, body: bytes, init: bool):
    pkg = root / "pinpkg"
    (pkg / "inc").mkdir(parents=True)
    if init:
        (pkg / "__init__.py").write_text("")
    if body:
        (pkg / "inc" / "k.cuh").write_bytes(body)
    return str(root)


def test_a_regular_package_file_holds_its_hash_and_names_a_change(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(_portion(tmp_path, b"__global__ void k() {}\n", init=True))
    importlib.invalidate_caches()
    sha = _sha(b"__global__ void k() {}\n")
    assert package_file_pins([("pinpkg/inc/k.cuh", sha)]) is None
    assert package_file_pins([("pinpkg/inc/k.cuh", None)]) is None  # None: only that it exists
    bad = package_file_pins([("pinpkg/inc/k.cuh", "0" * 16)], "the layout")
    assert bad == f"upstream shape changed: pinpkg/inc/k.cuh sha {sha}, expected {'0' * 16} (the layout)"
    assert package_file_pins([("pinpkg/inc/none.cuh", None)]).startswith("target missing: pinpkg/inc/none.cuh (not in ")
    assert package_file_pins([("nopkg_here/inc/k.cuh", None)]) == "target missing: nopkg_here/inc/k.cuh (no package nopkg_here)"
    sys.modules.pop("pinpkg", None)


def test_a_namespace_package_is_searched_in_every_portion(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    monkeypatch.syspath_prepend(_portion(second, b"x", init=False))
    monkeypatch.syspath_prepend(_portion(first, b"", init=False))  # the first portion, without the file
    importlib.invalidate_caches()
    assert package_file_pins([("pinpkg/inc/k.cuh", _sha(b"x"))]) is None
    sys.modules.pop("pinpkg", None)
