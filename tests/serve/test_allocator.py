"""The server's C allocator: which one --malloc picks, the environment it restarts with, what is loaded."""
from __future__ import annotations

import pytest


def test_the_allocator_restart_environment(tmp_path):
    from lmforge.serve import allocator

    je, tc = tmp_path / "libjemalloc.so.2", tmp_path / "libtcmalloc_minimal.so.4"
    je.write_bytes(b"")
    tc.write_bytes(b"")
    both, only_tc = {"jemalloc": (str(je),), "tcmalloc": (str(tc),)}, {"jemalloc": (), "tcmalloc": (str(tc),)}
    none = {"jemalloc": (), "tcmalloc": ()}
    env = allocator.restart_environment("auto", {"A": "1"}, both)  # jemalloc first, its purging thread on
    assert env == {"A": "1", "LD_PRELOAD": str(je), allocator.MARK: "auto",
                   "MALLOC_CONF": "background_thread:true"}
    assert allocator.restart_environment("auto", {"MALLOC_CONF": "narenas:1"}, both)["MALLOC_CONF"] == \
        "narenas:1"
    assert allocator.restart_environment("auto", {}, only_tc) == \
        {"LD_PRELOAD": str(tc), allocator.MARK: "auto"}
    kept = allocator.restart_environment("tcmalloc", {"LD_PRELOAD": "/x.so"}, both)["LD_PRELOAD"]
    assert kept == f"{tc}:/x.so"  # the user's preload stays, after ours
    swapped = allocator.restart_environment("jemalloc", {"LD_PRELOAD": f"/x.so {tc}"}, both)["LD_PRELOAD"]
    assert swapped == f"{je}:/x.so"  # an explicit choice replaces another allocator the user preloads
    plain = allocator.restart_environment("glibc", {"LD_PRELOAD": str(je)}, both)
    assert plain == {allocator.MARK: "glibc"}  # --malloc glibc: the preloaded jemalloc goes
    assert allocator.restart_environment("auto", {}, none) is None  # none installed: glibc, no restart
    assert allocator.restart_environment("glibc", {}, both) is None
    assert allocator.restart_environment("auto", {allocator.MARK: "auto"}, both) is None  # restarted already
    # preloaded by the user
    assert allocator.restart_environment("auto", {"LD_PRELOAD": str(tc)}, both) is None
    assert allocator.restart_environment("auto", {"LD_PRELOAD": "/usr/lib/libmimalloc.so"}, both) is None
    with pytest.raises(ValueError, match="--malloc tcmalloc: .*libtcmalloc-minimal4"):
        allocator.restart_environment("tcmalloc", {}, none)
    with pytest.raises(ValueError, match="--malloc jemalloc: .*libjemalloc2"):
        allocator.restart_environment("jemalloc", {}, only_tc)
    with pytest.raises(ValueError, match="--malloc 'hoard'"):
        allocator.restart_environment("hoard", {}, both)


def test_auto_chooses_the_first_installed_allocator(tmp_path):
    from lmforge.serve import allocator

    tc = tmp_path / "libtcmalloc_minimal.so.4"
    tc.write_bytes(b"")
    assert allocator.chosen("auto", {"jemalloc": (str(tmp_path / "no.so"),),
                                     "tcmalloc": (str(tc),)}) == "tcmalloc"
    assert allocator.chosen("auto", {"jemalloc": (), "tcmalloc": ()}) == "glibc"
    assert allocator.chosen("jemalloc") == "jemalloc"


def test_the_command_offers_every_allocator_choice():
    from lmforge.cli import build_parser
    from lmforge.serve import allocator

    action = next(a for a in build_parser()._subparsers._group_actions[0].choices["serve"]._actions
                  if a.dest == "malloc")
    assert tuple(action.choices) == allocator.CHOICES


def test_an_explicit_allocator_that_is_not_loaded_is_refused():
    from lmforge.serve import allocator

    here = allocator.active()  # this test process: whatever it was started with
    for name in ("jemalloc", "tcmalloc"):
        if here != name:
            with pytest.raises(ValueError, match=f"--malloc {name}: the library is not loaded"):
                allocator.active(name)
    assert allocator.active("auto") == here and allocator.active("glibc") == here
