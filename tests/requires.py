"""Skip marks for what the suite needs from outside pip, each reason naming the command that
installs it (tests/conftest.py groups the skips by reason at the end of a run)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import CHROMIUM

DICTD = Path("/usr/share/dictd")
DICTIONARIES = ("gcide", "foldoc", "jargon")
INSTALL_DICTIONARIES = "apt-get install " + " ".join(f"dict-{name}" for name in DICTIONARIES)

chromium = pytest.mark.skipif(not CHROMIUM.exists(),
                              reason=f"no chromium at {CHROMIUM} (apt-get install chromium)")


def has_dictionary(name: str) -> bool:
    """Whether Debian's dict-`name` is installed (its .dict.dz under /usr/share/dictd)."""
    return (DICTD / f"{name}.dict.dz").is_file()


def dictionary(name: str) -> pytest.MarkDecorator:
    """Skip unless Debian's dict-`name` is installed."""
    return pytest.mark.skipif(not has_dictionary(name), reason=f"no dict-{name} ({INSTALL_DICTIONARIES})")
