"""Shared by the tests of outputs that must never be written through a symbolic link."""
from __future__ import annotations

from pathlib import Path

import pytest


def refuse_the_link(jobs, link: Path, target: Path) -> None:
    """Each of `jobs` (callables) refuses the symbolic link `link` with UnsafePath naming it, and nothing is
    written into `target`, the folder it points to."""
    from lmforge.utils.atomic import UnsafePath

    for job in jobs:
        with pytest.raises(UnsafePath, match=f"^{link}: is a symbolic link"):
            job()
    assert list(target.iterdir()) == []


def link_checkpoints(out: Path, target: Path) -> Path:
    """`out` made a folder (it was a link) whose checkpoints/, what a training run writes into, is a link to
    `target`; returns that link."""
    out.unlink()
    out.mkdir()
    (out / "checkpoints").symlink_to(target, target_is_directory=True)
    return out / "checkpoints"
