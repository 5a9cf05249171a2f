"""The layout's budgets: imports run one way between packages (DESIGN.md's tiers) with no cycle
(function-level imports included), at most 8 top-level modules, files under 400 lines (tests' too), lines
of at most 110 columns (src and tests), functions under 40, a docstring on every public name; bench/ is a
package that never edits sys.path."""
from __future__ import annotations

import ast
import functools
import unicodedata
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lmforge"
BENCH = Path(__file__).resolve().parents[1] / "bench"
TESTS = Path(__file__).resolve().parent
MAX_COLUMNS = 110  # pyproject.toml's line-length: ruff's E501, which its default rules leave out

# Which package may import which: a package imports only packages of its own tier or a lower one
# (the picture in docs/architecture.md, lowest first: utils <- config <- tokenizer/data <- layers <-
# model/elmo/presets <- heads <- fast/quant <- io/convert <- objectives/generate <- train/tasks/analysis/
# compress/retrieval/pipelines/bakeoff <- serve <- cli). "lmforge" is the root __init__ (the public
# face); top-level modules count as packages of their own.
TIERS = (
    ("utils",),  # atomic files, eval mode, progress, timing, malloc: nothing else from lmforge
    ("config",),
    ("tokenizer", "data"),  # text in: they need only config
    ("layers",),
    ("model", "elmo", "presets"),
    ("heads",),
    ("fast", "quant"),
    ("io", "convert"),
    ("objectives", "generate"),
    ("train", "tasks", "analysis", "compress", "retrieval", "pipelines", "bakeoff", "lmforge"),
    ("serve",),
    ("cli",),
)
TIER = {package: rank for rank, packages in enumerate(TIERS) for package in packages}
# imports that the tiers would allow but the design forbids: (importer, imported)
FORBIDDEN = {("compress", "analysis"), ("quant", "fast")}
MAX_TOP_LEVEL_MODULES = 8


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict:
    """module name -> parsed tree, for every file under src/lmforge."""
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str, known: set) -> str | None:
    """The longest known module that `name` (a module or a name inside one) refers to."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict:
    """module -> the lmforge modules it imports anywhere in its file (inside functions too)."""
    return {module: set(targets) for module, targets in _import_graph().items()}  # a copy each caller owns


@functools.cache  # three tests read it: parsing every file of src took seconds a time
def _import_graph() -> dict:
    trees = _modules()
    known, graph = set(trees), {}
    for module, tree in trees.items():
        package = module if (PACKAGE.parent / module.replace(".", "/") / "__init__.py").exists() \
            else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                # `from pkg import sub` imports the module pkg.sub; `from mod import name`, mod itself
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for name in names:
                target = _resolve(name, known) if name.startswith("lmforge") else None
                if target and target != module:
                    targets.add(target)
        graph[module] = targets
    return graph


def find_cycle(graph: dict) -> list | None:
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle_anywhere():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def package_of(module: str) -> str:
    """"lmforge.fast.int8" -> "fast"; "lmforge.model" -> "model"; "lmforge" (the root) -> "lmforge"."""
    return module.split(".")[1] if "." in module else module


def layer_violations(graph: dict) -> list:
    """(module, imported module, why) for every import against TIERS or FORBIDDEN."""
    found = []
    for module, targets in sorted(graph.items()):
        source = package_of(module)
        for target in sorted(targets):
            dest = package_of(target)
            if source == dest:
                continue
            if source not in TIER or dest not in TIER:
                found.append((module, target, "a package missing from TIERS"))
            elif TIER[dest] > TIER[source]:
                found.append((module, target,
                              f"{source} (tier {TIER[source]}) imports {dest} (tier {TIER[dest]})"))
            elif (source, dest) in FORBIDDEN:
                found.append((module, target, f"{source} never imports {dest}"))
    return found


def test_imports_run_down_the_tiers():
    assert layer_violations(import_graph()) == []


def test_the_tier_check_finds_planted_violations():
    planted = {"lmforge.config.model": {"lmforge.model"}, "lmforge.compress.ffn": {"lmforge.analysis.maps"},
               "lmforge.quant.int8": {"lmforge.fast.linear", "lmforge.utils.timing"},
               "lmforge.fast.optimize": {"lmforge.quant.int8_ffn"}, "lmforge.newpkg.x": {"lmforge.config"}}
    assert [(m, t) for m, t, _ in layer_violations(planted)] == [
        ("lmforge.compress.ffn", "lmforge.analysis.maps"), ("lmforge.config.model", "lmforge.model"),
        ("lmforge.newpkg.x", "lmforge.config"), ("lmforge.quant.int8", "lmforge.fast.linear")]


def test_the_architecture_pictures_these_tiers():
    """docs/architecture.md's picture of which package may import which is TIERS, top tier first."""
    text = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    picture = text.split("walks them and holds the tiers", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    tiers = [tuple("lmforge" if name == "the public face" else name for name in
                   (part.strip() for part in line.strip().removeprefix("-> ").split(" / ")))
             for line in picture.strip().splitlines()]
    assert tiers == list(TIERS)[::-1]


def test_every_package_has_a_tier():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    packages |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert packages - set(TIER) == set()


def test_at_most_eight_top_level_modules():
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def test_bench_is_a_package_without_path_edits():
    assert (BENCH / "__init__.py").exists()
    edits = [p.name for p in sorted(BENCH.glob("*.py")) if "sys.path" in p.read_text()]
    assert edits == []


def test_every_bench_script_parses_its_arguments():
    """`python -m bench.X --help` prints usage: a script that ignored it would run (and write results)."""
    scripts = [p for p in sorted(BENCH.glob("*.py")) if 'if __name__ == "__main__"' in p.read_text()]
    assert scripts and [p.name for p in scripts if "ArgumentParser(" not in p.read_text()] == []


def test_the_model_core_imports_nothing_above_it():
    graph = import_graph()
    above = ("lmforge.convert", "lmforge.io", "lmforge.train", "lmforge.objectives", "lmforge.generate",
             "lmforge.tasks", "lmforge.cli", "lmforge.pipelines", "lmforge.heads", "lmforge.fast",
             "lmforge.quant")
    for module in ("lmforge.model", "lmforge.config"):
        assert not {t for t in graph[module] if t.startswith(above)}, module
    for module, targets in graph.items():
        if module.startswith("lmforge.layers"):
            assert not {t for t in targets if t.startswith(above + ("lmforge.model",))}, module


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_budgets(path):
    source = path.read_text()
    assert len(source.splitlines()) <= 400, f"{path.name}: over 400 lines"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno - node.lineno + 1 <= 40, f"{path.name}:{node.name} over 40 lines"
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_") \
                and node.col_offset == 0:
            assert ast.get_docstring(node), f"{path.name}:{node.name} has no docstring"


def python_files(root: Path) -> list:
    """The .py files under `root`, none in a hidden folder (a virtual environment)."""
    return [path for path in sorted(root.rglob("*.py"))
            if not any(part.startswith(".") for part in path.relative_to(root).parts)]


@pytest.mark.parametrize("path", python_files(TESTS), ids=lambda p: str(p.relative_to(TESTS)))
def test_test_file_budget(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= 400, f"{path.relative_to(TESTS)}: over 400 lines"


def columns(line: str) -> int:
    """The width of `line` as ruff's E501 counts it: a wide East Asian character (中) takes two columns."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


def long_lines(root: Path, paths) -> list:
    """'file:line (N columns)', the file relative to `root`, for every line of `paths` over MAX_COLUMNS."""
    return [f"{path.relative_to(root)}:{n} ({columns(line)} columns)" for path in paths
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if columns(line) > MAX_COLUMNS]


def test_no_line_of_src_or_tests_is_over_110_columns():
    """Every line, a long string or regular expression too (ruff lets a line of one word pass)."""
    root = PACKAGE.parents[1]
    found = long_lines(root, python_files(root / "src") + python_files(TESTS))
    assert found == [], f"lines over {MAX_COLUMNS} columns: {', '.join(found)}"


def test_the_line_check_finds_planted_long_lines(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n" + "y" * 111 + "\n" + "z" * 110 + "\n" + "中" * 56 + "\n",
                                   encoding="utf-8")
    assert long_lines(tmp_path, [tmp_path / "a.py"]) == ["a.py:2 (111 columns)", "a.py:4 (112 columns)"]


def test_imports_are_written_one_way():
    """A `from X import (...)` wraps its names onto as few lines as fit (the tree's one form); isort's
    one-name-a-line form, which an editor's formatter writes, is refused so the two do not mix again."""
    roots = (PACKAGE, BENCH, Path(__file__).resolve().parent)
    files = [(root, path) for root in roots for path in sorted(root.rglob("*.py"))
             if not any(part.startswith(".") for part in path.relative_to(root).parts)]  # not bench's venv
    expanded = [f"{path.relative_to(root.parent)}:{n}" for root, path in files
                for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                if line.lstrip().startswith("from ") and line.endswith(" import (")]  # in a function too
    assert expanded == []
