"""Documentation that cannot go stale: every ```bash / ```sh / ```console command and every ```python
block of README.md and docs/*.md runs here, and the static site builds with `mkdocs build --strict`.

The blocks of one file run in order in one temporary folder (a later block may read what an earlier
one wrote); Python blocks of a file share one namespace. A block whose first line is `# slow` is
marked slow (run with `-m slow`); one with a line `# needs: dict-gcide curl` skips, naming what is
missing, where that Debian dictionary or program is not installed (as tests/requires.py's marks skip
the suite's other tests). Blocks that must not run are fenced
```text. A command line `lmforge ...` with no shell syntax (quoted words are no syntax: bash and shlex
split them alike) runs in this process (lmforge.cli.main), which saves the ~3 s import of a subprocess;
any other line runs under bash.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.requires import has_dictionary

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGS = {"bash", "sh", "console", "python"}
FENCE = re.compile(r"^```(\S*)\s*$")
NEEDS = re.compile(r"^# needs: (.+)$", re.MULTILINE)
SHELL_SYNTAX = set("|&;<>()*?[]{}~#")  # what bash reads outside quotes only
EXPANDED = set("$`\\")  # what bash reads inside double quotes too
QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")


def runs_here(line: str) -> bool:
    """Whether a command line is `lmforge ...` with nothing a shell would expand, redirect or glob."""
    if line.split()[0] != "lmforge" or EXPANDED & set(line):
        return False
    bare = QUOTED.sub("", line)
    return not (SHELL_SYNTAX | set("\"'")) & set(bare)


def unmet(code: str) -> list:
    """What a block's `# needs:` lines name that this machine lacks: dict-NAME (Debian's dictionary) or a
    program on PATH."""
    names = [name for found in NEEDS.findall(code) for name in found.split()]
    return [name for name in names
            if not (has_dictionary(name[5:]) if name.startswith("dict-") else shutil.which(name))]


def blocks(path: Path) -> list:
    """(line of the opening fence, language, code) of each runnable fenced block in `path`."""
    found, lang, start, lines = [], None, 0, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = FENCE.match(line.strip())
        if lang is None and match and match.group(1):
            lang, start, lines = match.group(1), number, []
        elif lang is not None and line.strip() == "```":
            if lang in RUN_LANGS:
                found.append((start, lang, "\n".join(lines) + "\n"))
            lang = None
        elif lang is not None:
            lines.append(line)
    return found


def _cases() -> list:
    """One pytest param per runnable block, named file:line, slow when its first line says so, skipped
    where what it needs is missing."""
    cases = []
    for path in DOC_FILES:
        for line, lang, code in blocks(path):
            marks = [pytest.mark.slow] if code.lstrip().startswith("# slow") else []
            if missing := " ".join(unmet(code)):
                marks.append(pytest.mark.skip(reason=f"needs {missing} (apt-get install {missing})"))
            name = f"{path.relative_to(ROOT)}:{line}"
            cases.append(pytest.param(path, line, lang, code, id=name, marks=marks))
    return cases


def commands(code: str) -> list:
    """The command lines of a shell block: `$ ` prompts stripped, continuations joined, comments dropped."""
    lines, pending = [], ""
    for raw in code.splitlines():
        line = raw[2:] if raw.startswith("$ ") else raw
        if pending:
            line = pending + " " + line.strip()
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1].rstrip()
            continue
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            lines.append(line.strip())
    return lines


class DocRun:
    """The state of one documentation file's run: its folder, its Python namespace, the blocks done."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.namespace, self.done = folder, {"__name__": "__docs__"}, set()

    def run(self, lang: str, code: str, where: str) -> list:
        """Run one block in this file's folder: (command, exit status, output tail) of each command run
        until one fails (a Python block is one command; an exception in it propagates, naming the block)."""
        if lang == "python":
            exec(compile(code, where, "exec"), self.namespace)
            return [("python", 0, "")]
        results = []
        for line in commands(code):
            results.append(self._shell(line))
            if results[-1][1]:
                break
        return results

    def _shell(self, line: str) -> tuple:
        if runs_here(line):
            from lmforge.cli import main
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    status = main(shlex.split(line)[1:])
                except SystemExit as stop:  # argparse's --help and usage errors exit
                    status = stop.code or 0
            return line, status, out.getvalue()[-2000:]
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", line], cwd=self.folder, env=env,
                              capture_output=True, text=True, timeout=600)
        return line, done.returncode, done.stderr[-2000:]


def failures(results: list, where: str) -> list:
    """The failed commands of a block's results, each said with its block, status and output."""
    return [f"{where}: `{line}` exited {status}\n{tail}" for line, status, tail in results if status]


@pytest.fixture(scope="session")
def doc_runs(tmp_path_factory):
    """file -> its DocRun, one temporary folder per documentation file for the whole session."""
    runs = {}

    def get(path: Path) -> DocRun:
        if path not in runs:
            runs[path] = DocRun(tmp_path_factory.mktemp(path.stem))
        return runs[path]
    return get


@pytest.mark.parametrize("path,line,lang,code", _cases())
def test_doc_block(path, line, lang, code, doc_runs, monkeypatch, request):
    """The block runs without error, after every earlier block of its file (run first if not yet)."""
    state = doc_runs(path)
    monkeypatch.chdir(state.folder)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    selected_slow = request.node.get_closest_marker("slow") is not None
    for earlier, lang_before, before in blocks(path):
        if earlier >= line:
            break
        if earlier not in state.done:
            if (before.lstrip().startswith("# slow") and not selected_slow) or unmet(before):
                continue  # a fast block never waits on a slow or skipped one; docs keep fast ones independent
            where = f"{path.name}:{earlier}"
            assert not (failed := failures(state.run(lang_before, before, where), where)), failed[0]
            state.done.add(earlier)
    where = f"{path.name}:{line}"
    results = state.run(lang, code, where)
    assert results and not failures(results, where), \
        (failures(results, where) or [f"{where}: no command ran"])[0]
    state.done.add(line)


def test_every_doc_has_a_runnable_block():
    """Each guide shows at least one command or Python call that this file runs."""
    empty = [p.name for p in DOC_FILES[1:] if p.name not in ("index.md", "architecture.md") and not blocks(p)]
    assert not empty, f"guides without a runnable block: {empty}"


def test_blocks_parser_reads_fences_and_continuations(tmp_path):
    """The extractor keeps runnable languages only and joins backslash continuations."""
    page = tmp_path / "p.md"
    page.write_text("x\n```bash\nlmforge a \\\n  --b 1\n# note\n```\n```text\nno\n```\n"
                    "```python\nx = 1\n```\n")
    found = blocks(page)
    assert [(lang, line) for line, lang, _ in found] == [("bash", 2), ("python", 10)]
    assert commands(found[0][2]) == ["lmforge a --b 1"]


def test_only_a_line_bash_would_pass_as_it_is_runs_in_this_process():
    """Quoted words run here (shlex splits them as bash does); expansions, redirections, globs, comments
    and unbalanced quotes go to bash."""
    assert runs_here('lmforge fill-mask --model m "The city of [MASK] is large?" --top-k 3')
    assert runs_here("lmforge embed --model m 'a; b' --out v.npy")
    for line in ['lmforge embed "$HOME"', "lmforge embed a > out", "lmforge embed *.txt", 'lmforge x "a\\"',
                 "lmforge embed a # note", "lmforge embed it's", "python -c 'print(1)'"]:
        assert not runs_here(line), line


def test_needs_names_what_is_missing():
    """A block's `# needs:` line is met by an installed program, and names each missing one."""
    assert unmet("# needs: bash\nls\n") == []
    assert unmet("# slow\n# needs: dict-no-such-dictionary no-such-program-x\nls\n") == [
        "dict-no-such-dictionary", "no-such-program-x"]
    assert unmet("echo '# needs: no-such-program-x'\n") == []


def test_site_builds_strict(tmp_path, caplog):
    """`mkdocs build --strict` succeeds: every link between the pages resolves. Built in this process with
    mkdocs' own build (the command's process spent most of its time importing lmforge for the hook)."""
    build = pytest.importorskip("mkdocs.commands.build",
                                reason="mkdocs is not installed (pip install -e '.[dev]')")
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    config = load_config(str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(tmp_path / "site"))
    assert config.strict
    config.plugins.on_startup(command="build", dirty=False)
    try:
        build.build(config)
    except Abort as err:  # a warning in strict mode: each one is in the log
        pytest.fail(f"{err}: {[r.getMessage() for r in caplog.records if r.levelname == 'WARNING']}")
    finally:
        config.plugins.on_shutdown()
    assert (tmp_path / "site" / "index.html").is_file()


def test_every_options_marker_renders_a_row_per_option():
    """The guides' option tables are made from the options objects (docs/hooks/options.py), one row
    per field, and every marker in the guides names an object the hook knows."""
    import dataclasses
    import importlib.util

    spec = importlib.util.spec_from_file_location("options_hook", ROOT / "docs" / "hooks" / "options.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    for name, where in hook.OPTIONS.items():
        module, cls = where.split(":")
        fields = dataclasses.fields(getattr(importlib.import_module(module), cls))
        table = hook.options_table(name).splitlines()
        assert [row.split("`")[1] for row in table[2:]] == [f.name for f in fields]
    used = {m for page in (ROOT / "docs").glob("*.md") for m in hook.MARKER.findall(page.read_text())}
    assert used and used <= set(hook.OPTIONS)
