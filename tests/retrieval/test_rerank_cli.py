"""lmforge retrieve --rerank DIR: the retriever's top --candidates re-ordered by a cross-encoder, the best --k
kept, in the order `lmforge.rerank` gives those passages; and the refusals of the flags (exit 2, one line)."""
from __future__ import annotations

import json

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.retrieval.dpr import passage_text
from lmforge.retrieval.passages import load_passages
from lmforge.tasks.finetune import TaskConfig, make_task, save_model
from lmforge.tokenizer.train import train_tokenizer

QUERY = "Where was Migom Koudand born?"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerank-cli")
    texts = [passage_text(p) for p in load_passages(None)]
    tokenizer = train_tokenizer(texts, "wordpiece", 300)
    torch.manual_seed(0)
    model = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64,
                          vocab_size=tokenizer.vocab_size, max_seq_len=96)
    model.save(root / "plain")
    tokenizer.save(root / "plain")
    save_model(make_task("rerank", model, tokenizer, [], TaskConfig(max_len=96)), root / "rr")
    assert main(["index", "build", "--out", str(root / "ix"), "--quiet"]) == 0  # BM25 only
    return root


def _results(capsys) -> list:
    return [json.loads(x) for x in capsys.readouterr().out.splitlines()]


def test_rerank_reorders_the_candidates(setup, capsys):
    ix = str(setup / "ix")
    assert main(["retrieve", "--index", ix, "--query", QUERY, "--method", "bm25", "--k", "6"]) == 0
    (bm25,) = _results(capsys)
    argv = ["retrieve", "--index", ix, "--query", QUERY, "--method", "bm25", "--k", "3", "--candidates", "6",
            "--rerank", str(setup / "rr")]
    assert main(argv) == 0
    (reranked,) = _results(capsys)
    texts = [f"{r['title']}. {r['text']}" for r in bm25["results"]]
    expected = lmforge.rerank(setup / "rr", QUERY, texts, top_n=3)
    assert [r["id"] for r in reranked["results"]] == [bm25["results"][i]["id"] for i, _ in expected]
    assert [r["score"] for r in reranked["results"]] == pytest.approx([s for _, s in expected], abs=1e-4)
    assert [r["rank"] for r in reranked["results"]] == [1, 2, 3]
    assert [r["retriever_rank"] for r in reranked["results"]] == [i + 1 for i, _ in expected]


@pytest.mark.parametrize("extra,message", [
    (["--candidates", "6"], "--candidates: give --rerank DIR too"),
    (["--rerank", "RR", "--candidates", "2"], "--candidates 2: must be at least k (3)"),
    (["--rerank", "RR", "--candidates", "1001"], "--candidates 1001: must be an integer >= 1 and <= 1000"),
    (["--rerank", "PLAIN"], "not a reranker"),
    (["--rerank", "NOWHERE"], "no such directory"),
])
def test_rerank_flags_are_refused_in_one_line(setup, capsys, extra, message):
    names = {"RR": str(setup / "rr"), "PLAIN": str(setup / "plain"), "NOWHERE": str(setup / "none")}
    argv = ["retrieve", "--index", str(setup / "ix"), "--query", QUERY, "--method", "bm25", "--k", "3",
            *[names.get(a, a) for a in extra]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_cross_encoder_lmforge_cannot_score_with_is_refused_before_the_index_is_searched(tmp_path, capsys):
    """--rerank takes a CrossEncoder's folder (lmforge.rerank's rule), but not one whose Tanh lmforge cannot
    score with: that was let through to fail after the index was read and searched, a ValueError naming no
    flag; it is refused up front as Reranker.load refuses it, naming --rerank and the file."""
    pytest.importorskip("transformers")
    from tests.tasks.hf_reference import reference_dir

    _, folder = reference_dir(tmp_path / "ce", num_labels=1,
                              sentence_transformers={"activation_fn": "torch.nn.Tanh"})
    index = tmp_path / "ix"
    index.mkdir()
    (index / "passages.jsonl").write_text("not read: refused first\n")
    capsys.readouterr()  # the reference's own progress lines
    argv = ["retrieve", "--index", str(index), "--query", QUERY, "--rerank", str(folder)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--rerank {folder}: " in err and "activation_fn 'torch.nn.Tanh' is not supported" in err
    assert err.count("\n") == 1
