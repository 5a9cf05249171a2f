"""Measured figures cannot go stale: every number a README.md or docs/*.md table prints from a committed
bench/results JSON is that JSON's (README once printed the reranker's recall@1 as 0.732 vs 0.592 while
rerank.json said 0.774 vs 0.644, and no test noticed).

A figure table is one whose rows link a bench/results JSON (README's "Measured" table: the source cell's
link) or whose text since the heading above it names one (docs/retrieval.md's tables: the last one named).
Its figure cells are every cell but the first (what is measured), `machine` and `source`. The rule, the
same for every row: each number of a figure cell, at the precision it is printed with (0.908 stands for
anything in [0.9075, 0.9085]), is a number of the JSON, or 100 times one where the cell prints a % and the
number is not a ratio (96.5 % is a `metric` of 0.965). A ratio (`1.79x`) is one the JSON records under a
ratio's key (RATIO_KEY: `speedup`, `ratio`, `vs_reference`, `a / b`, ...), or, for a row in QUOTIENTS, the
quotient of the two numbers it names. No free "any a / b" rule, nor any number for a ratio: a JSON of a
few hundred timings has a quotient within 0.005 of any speed-up, and a seconds field near most.
"""
from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = re.compile(r"\]\((bench/results/[^)\s]+\.json)\)")
NAMED = re.compile(r"bench/results/[\w./-]+\.json")
NUMBER = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)(\s*x)?")
NOT_FIGURES = {"machine", "source"}
RATIO_KEY = re.compile(r"ratio|speedup|^vs_| / ")  # the keys a JSON records a ratio under

# A row whose figures come from another JSON than its table's: (file, first cell) -> that JSON.
SOURCES = {
    # the control run, without the Matryoshka loss: the text under the table names this JSON
    ("docs/retrieval.md", "trained, plain loss"): "bench/results/embedding_precision_plain.json",
}
# A ratio the JSON does not record, printed as the quotient of two of its numbers:
# (file, first cell) -> ((numerator's keys), (denominator's keys)), each a path into the JSON.
QUOTIENTS = {
    # default.json's attention rows record each variant's seconds, not their ratio: the 7.18x is full /
    # sliding-window 512 at T = 16,384 (rows 5 and 11)
    ("README.md", "sliding-window 512 vs full attention at T = 16,384 (time slope in T: 1.05)"): (
        ("attention", "rows", 5, "seconds"), ("attention", "rows", 11, "seconds")),
}
# Rows the rule cannot check, each with why: (file, first cell) -> reason. None at present.
EXCEPTIONS: dict = {}


def figure_rows(path: Path) -> list:
    """(first cell, figure cells, JSON path) of each figure-table row of `path`."""
    rows, named, header = [], None, None
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            header = None
            named = None if line.startswith("#") else (NAMED.findall(line) or [named])[-1]
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = [cell.lower() for cell in cells]
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        linked = [found for cell in cells for found in LINKED.findall(cell)]
        source = linked[0] if linked else named
        if source is not None:
            figures = [cell for cell, name in zip(cells[1:], header[1:]) if name not in NOT_FIGURES]
            rows.append((cells[0], figures, source))
    return rows


def _cases() -> list:
    """One pytest param per figure-table row, named file:first cell."""
    cases = []
    for path in DOC_FILES:
        where = str(path.relative_to(ROOT))
        for first, figures, source in figure_rows(path):
            source = SOURCES.get((where, first), source)
            marks = [pytest.mark.skip(reason=why)] if (why := EXCEPTIONS.get((where, first))) else []
            cases.append(pytest.param(where, first, figures, source, id=f"{where}:{first[:50]}", marks=marks))
    return cases


def numbers(data, ratios: bool = False, key: str = "") -> list:
    """Every number a field of a JSON document holds (booleans are not numbers here), in objects within
    lists too; not the items of a list of numbers, a run's raw samples, which match any figure near them.
    ratios: only those whose key (the nearest one above it) is a ratio's (RATIO_KEY)."""
    if isinstance(data, dict):
        return [found for name, value in data.items() for found in numbers(value, ratios, name)]
    if isinstance(data, list):
        return [found for value in data if isinstance(value, (dict, list))
                for found in numbers(value, ratios, key)]
    if ratios and not RATIO_KEY.search(key):
        return []
    return [float(data)] if isinstance(data, (int, float)) and not isinstance(data, bool) else []


@cache
def _document(source: str):
    """A committed JSON, read once."""
    return json.loads((ROOT / source).read_text(encoding="utf-8"))


def row_numbers(where: str, first: str, source: str, ratios: bool = False) -> list:
    """The numbers a row's figures may be: its JSON's (ratios: those under a ratio's key), and the quotient
    QUOTIENTS names for it."""
    document = _document(source)
    found = numbers(document, ratios)
    for numerator, denominator in [QUOTIENTS[(where, first)]] if (where, first) in QUOTIENTS else []:
        top, bottom = document, document
        for key in numerator:
            top = top[key]
        for key in denominator:
            bottom = bottom[key]
        found.append(top / bottom)
    return found


def unmatched(cell: str, found: list, ratios: list | None = None) -> list:
    """The numbers printed in `cell` that are not among `found`, rounded as printed (nor 100 times one of
    them, where the cell prints a % and the number is not a ratio); a ratio (`1.79x`) among `ratios` alone
    (None: `found`)."""
    missing = []
    for text, ratio in NUMBER.findall(cell):
        half = 0.5 * 10.0 ** -len(text.partition(".")[2]) + 1e-9
        scales = (1, 100) if "%" in cell and not ratio else (1,)
        pool = found if not ratio or ratios is None else ratios
        if not any(abs(scale * value - float(text)) <= half for value in pool for scale in scales):
            missing.append(text + ratio.strip())
    return missing


@pytest.mark.parametrize("where, first, figures, source", _cases())
def test_row_figures_are_its_json(where, first, figures, source):
    """Each number of the row's figure cells is its JSON's, rounded as printed (or a ratio of one field)."""
    assert (ROOT / source).is_file(), f"{where}: {first!r} links {source}, which is not committed"
    found, ratios = row_numbers(where, first, source), row_numbers(where, first, source, ratios=True)
    missing = [text for cell in figures for text in unmatched(cell, found, ratios)]
    assert not missing, f"{where}: {first!r} prints {missing}, not in {source} ({' | '.join(figures)})"


def test_the_figure_tables_are_found():
    """README's Measured table, docs/retrieval.md's two tables and docs/gpu.md's ELMo table are read, each
    row with its JSON, so the check above cannot pass by finding no rows."""
    readme = figure_rows(ROOT / "README.md")
    assert len(readme) >= 17
    assert ("0.774 vs 0.644", "bench/results/rerank.json") in {(row[1][0], row[2]) for row in readme}
    docs = {(row[0], row[2]) for row in figure_rows(ROOT / "docs" / "retrieval.md")}
    assert ("recall@1", "bench/results/rerank_dense.json") in docs
    assert ("untrained", "bench/results/embedding_precision.json") in docs
    # docs/gpu.md's ELMo step time on an H200, named in the text above its table
    gpu = {(row[0], row[2]) for row in figure_rows(ROOT / "docs" / "gpu.md")}
    assert ("the pretraining run", "bench/results/elmo_features_h200.json") in gpu


def test_every_override_names_a_row():
    """SOURCES, QUOTIENTS and EXCEPTIONS name rows that exist: a renamed row leaves no entry behind."""
    rows = {(str(path.relative_to(ROOT)), row[0]) for path in DOC_FILES for row in figure_rows(path)}
    assert set(SOURCES) | set(QUOTIENTS) | set(EXCEPTIONS) <= rows


def test_the_rule_catches_a_stale_figure():
    """The stale reranker row fails against rerank.json and its fix passes; a % is 100 times a fraction; a
    ratio is a recorded number, never a free quotient, and QUOTIENTS' one is README's 7.18x."""
    rerank = numbers(_document("bench/results/rerank.json"))
    assert unmatched("0.732 vs 0.592", rerank) == ["0.732", "0.592"]
    assert unmatched("0.774 vs 0.644", rerank) == []
    assert unmatched("96.5 -> 96.0 %", [0.965, 0.96]) == []
    assert unmatched("96.5 -> 96.0", [0.965, 0.96]) == ["96.5", "96.0"]
    assert unmatched("0.97x, 1.5 %", [0.0097, 0.015]) == ["0.97x"]
    assert unmatched("7.18x", [5.5236, 0.7694]) == ["7.18x"]
    # a ratio is matched among the numbers under a ratio's key alone, not a time or a count near it
    document = {"seconds": 2.04, "threads": 2, "runs": [{"speedup": 1.43}], "vs_reference": 2.43}
    found, ratios = numbers(document), numbers(document, ratios=True)
    assert ratios == [1.43, 2.43]
    assert unmatched("2.04x, 2.00x, 1.43x, 2.43x", found, ratios) == ["2.04x", "2.00x"]
    assert unmatched("2.04 s", found, ratios) == []  # a figure that is no ratio is any number
    (where, first), _ = next(iter(QUOTIENTS.items()))
    default = "bench/results/default.json"
    assert unmatched("7.18x", [], row_numbers(where, first, default, ratios=True)) == []
