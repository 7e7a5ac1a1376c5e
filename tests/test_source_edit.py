"""source_edit: a function recompiled from its own source with snippets replaced."""

import importlib.util
import textwrap
import traceback

import pytest

from sglang_hostsync_plugin.source_edit import SourceEditError, edit_function

TOY = '''
from __future__ import annotations

SCALE = 2


class Box:
    def total(self, values: list[Unknown]) -> int:
        out = 0
        for v in values:
            out += v * SCALE
        if out < 0:
            raise ValueError("negative")
        return out


def twice(x):
    return x + x


@staticmethod
def decorated(x):
    return x
'''


@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "toy_mod.py"
    path.write_text(textwrap.dedent(TOY))
    spec = importlib.util.spec_from_file_location("toy_mod", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_replaces_once_binds_names_and_keeps_live_globals(toy):
    seen = []
    edited = edit_function(toy.Box.total, (("            out += v * SCALE\n", "            out += hook(v) * SCALE\n"),),
                           {"hook": lambda v: seen.append(v) or v})
    assert edited(toy.Box(), [1, 2, 3]) == 12 and seen == [1, 2, 3]
    toy.SCALE = 10  # the module's globals are the copy's globals
    assert edited(toy.Box(), [1]) == 10
    assert edited.__qualname__ == "Box.total" and edited.__module__ == "toy_mod"
    assert toy.Box.total(toy.Box(), [1]) == 10  # the original is untouched


def test_tracebacks_point_at_the_original_file_and_lines(toy):
    edited = edit_function(toy.Box.total, (("out += v * SCALE", "out += v"),), {})
    with pytest.raises(ValueError) as err:
        edited(toy.Box(), [-1])
    frame = traceback.extract_tb(err.tb)[-1]
    assert frame.filename == toy.__file__ and frame.line == 'raise ValueError("negative")'
    assert edited.__code__.co_firstlineno == toy.Box.total.__code__.co_firstlineno


@pytest.mark.parametrize("old, count", [("not in the source", 0), ("v", None)])
def test_a_snippet_must_occur_exactly_once(toy, old, count):
    with pytest.raises(SourceEditError, match=r"expected one .* found (0|[2-9])"):
        edit_function(toy.Box.total, ((old, "x"),), {})


def test_decorated_functions_are_refused(toy):
    with pytest.raises(SourceEditError, match="decorated"):
        edit_function(toy.decorated.__func__ if hasattr(toy.decorated, "__func__") else toy.decorated,
                      (("return x", "return 0"),), {})


def test_target_dp_meta_edit_builds_from_the_pinned_method():
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang_hostsync_plugin.slots import target_dp_meta as tdm

    stock = ForwardBatch.prepare_mlp_sync_batch
    edited = edit_function(stock, (tdm.PADDED_COUNTS_H2D,), {"_hostsync_stage_padded_counts": tdm.stage_padded_counts})
    assert "global_num_tokens_pinned" in stock.__code__.co_varnames
    assert "global_num_tokens_pinned" not in edited.__code__.co_varnames
    assert edited.__code__.co_freevars == ("_hostsync_stage_padded_counts",)
    assert edited.__globals__ is stock.__globals__


def test_edit_refuses_any_source_but_the_pinned_one():
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang_hostsync_plugin.slots import target_dp_meta as tdm

    stock = ForwardBatch.prepare_mlp_sync_batch
    assert edit_function(stock, (tdm.PADDED_COUNTS_H2D,), {"_hostsync_stage_padded_counts": tdm.stage_padded_counts},
                         expected_sha=tdm.PREPARE_SHA).__globals__ is stock.__globals__

    def other_plugins_wrapper(self, model_runner):  # what HookRegistry hands over under another AROUND hook
        return stock(self, model_runner)

    with pytest.raises(SourceEditError, match="wrapped by another hook"):
        edit_function(other_plugins_wrapper, (tdm.PADDED_COUNTS_H2D,), {}, expected_sha=tdm.PREPARE_SHA)


def test_hook_under_another_plugins_wrapper_calls_it_and_says_so(monkeypatch, caplog):
    from sglang_hostsync_plugin.slots import target_dp_meta as tdm

    calls = []

    def other_plugins_wrapper(self, model_runner):
        calls.append((self, model_runner))
        return "theirs"

    monkeypatch.setattr(tdm.PREPARE, "_edited", None)
    monkeypatch.setattr(tdm.PREPARE, "failed", False)
    assert not tdm.PREPARE.live()  # not called yet
    with caplog.at_level("ERROR", logger="sglang.srt.plugins.hostsync"):
        assert tdm.PREPARE.hook(other_plugins_wrapper, "batch", "runner") == "theirs"
        assert tdm.PREPARE.hook(other_plugins_wrapper, "batch", "runner") == "theirs"
    assert calls == [("batch", "runner")] * 2 and tdm.PREPARE.failed and not tdm.PREPARE.live()
    assert caplog.text.count("target_dp_meta: prepare_mlp_sync_batch runs unedited") == 1


def test_every_shipped_source_edit_applies_to_the_pinned_sglang():
    """Each owned slot's PinnedEdit makes its edit in the precheck; all of them apply here."""
    from sglang_hostsync_plugin.slots import fused_draft_page_locs as fdl
    from sglang_hostsync_plugin.slots import greedy_row_argmax as gra
    from sglang_hostsync_plugin.slots import target_dp_meta as tdm
    from sglang_hostsync_plugin.source_edit import PinnedEdit

    edits = [fdl.PREPARE, tdm.PREPARE, gra.SAMPLE_ONCE, gra.DRAFT_EXTEND_ONCE]
    assert all(isinstance(e, PinnedEdit) and e.check() is None for e in edits)
    wrong_sha = PinnedEdit("x", tdm.PREPARE.path, tdm.PREPARE.edits, tdm.PREPARE.bind, "0" * 16)
    assert "source sha" in wrong_sha.check()


def test_read_source_gives_what_inspect_gives():
    """The doctor's check of a module that does not import here (no sgl_kernel) reads its file;
    on importable SGLang functions and methods that text is exactly inspect.getsource's."""
    import inspect

    import pytest

    from sglang_hostsync_plugin.checks import read_source, resolve

    for path in ("sglang.srt.speculative.eagle_utils.eagle_sample",
                 "sglang.srt.speculative.eagle_worker_common.prepare_for_draft_extend",
                 "sglang.srt.managers.overlap_utils.FutureMap.resolve_seq_lens_cpu",
                 "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode"):
        assert read_source(path) == inspect.getsource(inspect.unwrap(resolve(path))), path
    with pytest.raises(AttributeError):
        read_source("sglang.srt.managers.overlap_utils.FutureMap.no_such_method")
    with pytest.raises(ModuleNotFoundError):
        read_source("sglang.srt.no_such_module.f")


def test_an_edit_sites_parts_are_live_only_once_a_variant_with_their_edits_compiled(toy, caplog):
    """``PinnedEdit.live`` of a site's part asks the site (the part's own ``_edited`` is never set)."""
    import hashlib
    import inspect

    from sglang_hostsync_plugin.source_edit import EditSite

    sha = hashlib.sha256("".join(inspect.getsourcelines(toy.Box.total)[0]).encode()).hexdigest()[:16]
    site = EditSite("toy_mod.Box.total", sha)
    a = site.edit("a", (("            out += v * SCALE\n", "            out += v * SCALE + 1\n"),), dict)
    b = site.edit("b", (("        return out\n", "        return -out\n"),), dict)
    bad = site.edit("bad", (("not in the source", "x"),), dict)
    assert not a.live() and not b.live()
    assert site.variant(toy.Box.total, ("a",))(toy.Box(), [1, 2]) == 8
    assert a.live() and not b.live()
    with caplog.at_level("ERROR", logger="sglang.srt.plugins.hostsync"):
        assert site.variant(toy.Box.total, ("b", "bad"))(toy.Box(), [1, 2]) == 6  # SGLang's function
    assert not b.live() and not bad.live() and a.live()
    assert site.variant(toy.Box.total, ("a", "b"))(toy.Box(), [1, 2]) == -8
    assert b.live()
