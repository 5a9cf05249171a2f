"""An index directory is verified on read: a swapped, cut or edited passages.jsonl, a changed BM25 file
or a part from another build is refused in one line naming the file (exit status 2), never answered
from; `index build` refuses passages with no word to index naming the file and a passage; queries are
embedded with the encoder options the passages were."""
from __future__ import annotations

import json
import shutil
import warnings

import pytest

from lmforge.cli import main
from tests.retrieval.conftest import tiny_bert

QUERY = "Where was Dreatou Klaisebor born?"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(a tiny BERT folder, an index of the built-in passages with BM25 and dense parts)."""
    root = tmp_path_factory.mktemp("index-files")
    tiny_bert(root / "tiny")
    assert main(["index", "build", "--out", str(root / "ix"), "--model", str(root / "tiny"), "--quiet",
                 "max_length=32", "pooling=cls"]) == 0
    return root / "tiny", root / "ix"


@pytest.fixture
def index(built, tmp_path):
    """A copy of the built index to damage."""
    return shutil.copytree(built[1], tmp_path / "ix")


def _query(index, capsys, *flags, query: str = QUERY) -> tuple:
    """(exit status, JSON lines printed, standard error) of one query."""
    code = main(["retrieve", "--index", str(index), "--query", query, *flags])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def _refusal(index, capsys, *flags) -> str:
    """The one-line error of a query refused (exit status 2, nothing on standard output)."""
    code, printed, err = _query(index, capsys, *flags)
    assert code == 2 and not printed and err.count("\n") == 1, err
    return err


def test_an_intact_index_answers_both_ways(index, capsys):
    for method in ("bm25", "dense"):
        code, printed, _ = _query(index, capsys, "--method", method, "--k", "5")
        assert code == 0 and len(printed[0]["results"]) == 5
    assert printed[0]["results"][0]["id"]  # dense answered too


@pytest.mark.parametrize("damage", ["swap", "cut", "edit"])
def test_a_changed_passages_file_is_refused_naming_it(index, capsys, damage):
    lines = (index / "passages.jsonl").read_text().splitlines(keepends=True)
    if damage == "swap":  # the BM25 rows then point at the other passage's id and text
        lines[108], lines[109] = lines[109], lines[108]
    elif damage == "cut":
        lines = lines[:100]
    else:
        lines[108] = lines[108].replace("Sileafe", "Sadun")
    (index / "passages.jsonl").write_text("".join(lines))
    for method in ("bm25", "dense"):
        err = _refusal(index, capsys, "--method", method)
        assert "passages.jsonl: checksum does not match index.json" in err


def test_a_changed_bm25_file_is_refused_naming_it(index, capsys):
    params = index / "bm25" / "params.index.json"
    params.write_text(params.read_text() + " ")
    assert "params.index.json: checksum does not match" in _refusal(index, capsys, "--method", "bm25")


@pytest.mark.parametrize("name", ["passages.jsonl", "index.json", "bm25/params.index.json",
                                  "bm25/manifest.json", "dense/embeddings.npy", "dense/ids.json",
                                  "dense/manifest.json"])
def test_the_python_face_refuses_a_damaged_index_with_a_type_of_its_own(index, name):
    """It raised a bare ValueError, as for any bad argument: a caller could not tell a damaged index."""
    from lmforge.retrieval.index_dir import IndexDamaged
    from lmforge.retrieval.jobs import QueryOptions, query_index

    file = index / name
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    method = "dense" if name.startswith("dense") else "bm25"
    with pytest.raises(IndexDamaged) as refused:
        query_index(index, [QUERY], QueryOptions(method=method))
    assert str(refused.value).startswith(str(file)) and "\n" not in str(refused.value)


def test_a_part_from_another_build_is_refused(index, built, capsys, tmp_path):
    assert main(["index", "build", "--out", str(tmp_path / "other"), "--seed", "1", "--quiet"]) == 0
    capsys.readouterr()
    shutil.rmtree(index / "bm25")
    # whole and self-consistent, but not this index's
    shutil.copytree(tmp_path / "other" / "bm25", index / "bm25")
    assert "bm25/manifest.json: missing, or not the one" in _refusal(index, capsys, "--method", "bm25")
    (index / "index.json").unlink()
    assert "index.json: missing" in _refusal(index, capsys, "--method", "bm25")


def test_a_bm25_only_build_does_not_adopt_an_earlier_dense_part(index, capsys):
    assert main(["index", "build", "--out", str(index), "--quiet"]) == 0
    capsys.readouterr()
    # each way out named on both doors, the argument beside its flag ("build it with model= (--model)" read
    # oddly; before that, it said only "--model" and "--method bm25", flags a Python caller never gave)
    said = ("no dense index: build it with an encoder (model=, --model), or query with method='bm25' "
            "(--method bm25)")
    assert _refusal(index, capsys).endswith(f"{said}\n")
    assert _query(index, capsys, "--method", "bm25")[0] == 0
    from lmforge.config.options import OptionsError
    from lmforge.retrieval.jobs import query_index

    with pytest.raises(OptionsError) as python:
        query_index(index, [QUERY])
    assert str(python.value).endswith(said) and python.value.field == "method"


def test_queries_are_embedded_with_the_options_the_passages_were(built, index, capsys):
    from lmforge.retrieval.dpr import BiEncoder
    from lmforge.retrieval.index import DenseIndex

    code, printed, _ = _query(index, capsys, "--k", "3")
    assert code == 0
    dense = DenseIndex.load(index / "dense")
    assert dense.manifest["options"] == {"pooling": "cls", "normalize": True, "max_length": 32}
    query = BiEncoder.from_dir(built[0], pooling="cls", max_length=32).encode([QUERY])
    scores, positions = dense.search(query, 3)
    assert [r["id"] for r in printed[0]["results"]] == [dense.ids[int(i)] for i in positions[0]]
    assert [r["score"] for r in printed[0]["results"]] == [round(float(s), 4) for s in scores[0]]


@pytest.mark.parametrize("lines", [['{"id": "a", "title": "t", "text": ""}'],
                                   ['{"id": "a", "title": "t", "text": "the of and"}',
                                    '{"id": "b", "title": "x", "text": "a"}']])
def test_passages_without_any_word_to_index_are_refused_naming_file_and_passage(tmp_path, capsys, lines):
    source = tmp_path / "empty.jsonl"
    source.write_text("\n".join(lines) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning on the way
        code = main(["index", "build", "--passages", str(source), "--out", str(tmp_path / "ix"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "empty.jsonl: no passage has a word BM25 can index (passage 'a'" in err
    assert not (tmp_path / "ix").exists()  # refused before anything is written


def test_a_passage_without_words_beside_others_is_indexed_and_found_by_no_query(tmp_path, capsys):
    source = tmp_path / "some.jsonl"
    rows = [{"id": "a", "title": "t", "text": ""}, {"id": "b", "title": "Cats", "text": "cats purr softly"}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["index", "build", "--passages", str(source), "--out", str(tmp_path / "ix"), "--quiet"]) == 0
    capsys.readouterr()
    code, printed, _ = _query(tmp_path / "ix", capsys, "--method", "bm25", "--k", "2",
                              query="which cats purr")
    found = [(r["id"], r["score"] > 0) for r in printed[0]["results"]]
    assert code == 0 and found == [("b", True), ("a", False)]


@pytest.mark.parametrize("part", ["bm25", "dense"])
def test_a_build_refuses_to_replace_a_part_folder_holding_files_of_the_users(built, tmp_path, capsys, part):
    from lmforge.retrieval.jobs import build_index_dir
    from lmforge.utils.atomic import UnsafePath

    out = tmp_path / "out"
    (out / part).mkdir(parents=True)
    (out / part / "notes.txt").write_text("mine")
    assert main(["index", "build", "--out", str(out), "--model", str(built[0]), "--quiet"]) == 2
    assert "notes.txt" in capsys.readouterr().err
    with pytest.raises(UnsafePath, match="notes.txt") as err:
        build_index_dir(out, None, str(built[0]), progress=False)
    assert err.value.field == "out" and sorted(p.name for p in out.rglob("*")) == [part, "notes.txt"]
    rebuilt = shutil.copytree(built[1], tmp_path / "again")  # an index's own parts are rebuilt in place
    assert main(["index", "build", "--out", str(rebuilt), "--model", str(built[0]), "--quiet"]) == 0
