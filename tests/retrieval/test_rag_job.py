"""`lmforge retrieve rag` (retrieval/rag_job.py) on a tiny BERT retriever and the bart-tiny generator, a few
questions: it trains, writes rag.json with its exact match and the decoding used, resumes bitwise where
an unbroken run ends; a bad option is refused alike by the command (its flag, one line, status 2) and the
Python job (an OptionsError naming the field), before any work."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

import lmforge
import lmforge.retrieval.rag_job as rag_job
from lmforge.cli import main
from lmforge.config.options import OptionsError
from lmforge.retrieval.dpr import BiEncoder
from lmforge.retrieval.job_options import RagOptions
from lmforge.train import TrainConfig
from tests.retrieval.conftest import tiny_bert

FLAGS = ["--generator", "bart-tiny", "--k", "2", "--max-len", "64", "--seed", "1", "batch_size=4", "lr=1e-3",
         "warmup=1", "progress=false", "device=cpu", "save_every=2"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("tiny-rag"))


@pytest.fixture(autouse=True)
def few_questions(monkeypatch):
    """The built-in passages with 8 training and 4 test questions: a run of seconds."""
    passages, sets = rag_job.question_sets(None, None, 0)
    few = {"train": sets["train"][:8], "test": sets["test"][:4]}
    monkeypatch.setattr(rag_job, "question_sets", lambda *args, **kw: (passages, few))


def _status(argv: list) -> int:
    """The command's exit status, argparse's refusals (SystemExit) included."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def _final(out) -> dict:
    return lmforge.load(out / "final").state_dict()


def test_a_run_writes_its_exact_match_and_a_resumed_one_ends_where_it_does(tiny, tmp_path, capsys):
    argv = ["retrieve", "rag", "--retriever", str(tiny), "--out", str(tmp_path / "whole"), "--steps", "4",
            *FLAGS]
    assert main(argv) == 0
    shown = capsys.readouterr().out
    assert "exact_match" in shown and "thorough" in shown  # the table says the decoding used
    whole = json.loads((tmp_path / "whole" / "rag.json").read_text())
    assert 0 <= whole["exact_match"] <= 1 and whole["test"] == 4 and whole["seed"] == 1
    said = (whole["kind"], whole["k"], whole["closed_book"], whole["decoding"])
    assert said == ("token", 2, False, "thorough")
    assert "lm" in lmforge.load(tmp_path / "whole" / "final").heads
    saved, original = BiEncoder.from_dir(tmp_path / "whole" / "retriever"), lmforge.load(tiny).state_dict()
    trained = saved.model.state_dict()  # the question encoder trained; the passages' is the index's own
    assert any(not torch.equal(trained[k], original[k]) for k in original)
    assert all(torch.equal(v, original[k]) for k, v in saved.passage_model.state_dict().items())
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")  # as if killed after the step-2 checkpoint
    shutil.rmtree(sorted((tmp_path / "cut" / "checkpoints").iterdir())[-1])
    shutil.rmtree(tmp_path / "cut" / "final")
    cfg = TrainConfig(steps=4, batch_size=4, lr=1e-3, warmup=1, progress=False, device="cpu", seed=1,
                      save_every=2)
    resumed = rag_job.run_rag(str(tiny), tmp_path / "cut", cfg, generator="bart-tiny",
                              options=RagOptions(k=2, max_len=64), resume=True, log=lambda m: None)
    assert resumed == {**whole, "retriever": str(tiny)}
    a, b = _final(tmp_path / "whole"), _final(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    other = RagOptions(k=1, max_len=64)  # another run's settings: refused, not continued with them
    with pytest.raises(ValueError, match="k=2"):
        rag_job.run_rag(str(tiny), tmp_path / "cut", cfg, generator="bart-tiny", options=other, resume=True,
                        log=lambda m: None)


@pytest.mark.parametrize("flags, said", [
    (["--kind", "token", "--decoding", "fast"], "--decoding fast: Fast Decoding is RAG-Sequence's"),
    (["--num-beams", "65"], "--num-beams 65: must be an integer >= 1 and <= 64"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0: must be"),
    (["--k", "-1"], "--k -1: must be"),
    (["--question-lr-scale", "2"], "--question-lr-scale 2: must be"),
    (["--kind", "marginal"], "--kind marginal: not one of token, sequence"),
    (["--generator", "{tmp}/none"], "--generator {tmp}/none: "),
    (["--k", "185"], "--k 185: more than the 184 passages"),  # after the passages are read, before training
    (["--max-new-tokens", "64"], "--max-new-tokens 64: the answer and its start token are more than"),
    # each within its bounds, together past the generator's tokens in one pass
    (["--k", "1000", "--num-beams", "64"], "--k 1000: with num_beams=64, batch_size=32, max_len=64"),
])
def test_a_bad_option_is_one_line_naming_its_flag_and_nothing_is_trained(tiny, tmp_path, capsys, flags, said):
    flags = [f.format(tmp=tmp_path) for f in flags]
    out = tmp_path / "out"
    argv = ["retrieve", "rag", "--retriever", str(tiny), "--out", str(out), "--generator", "bart-tiny",
            "--max-len", "64", *flags, "progress=false"]
    assert _status(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said.format(tmp=tmp_path) in err, err
    assert not (out / "checkpoints").exists() and not (out / "rag.json").exists()


@pytest.mark.parametrize("bad, field", [({"kind": "token", "decoding": "fast"}, "decoding"),
                                        ({"num_beams": 0}, "num_beams"), ({"k": 1001}, "k"),
                                        ({"max_new_tokens": 4097}, "max_new_tokens")])
def test_the_python_job_refuses_what_the_command_refuses_naming_the_field(tiny, tmp_path, bad, field):
    with pytest.raises(OptionsError) as err:
        RagOptions(**bad)
    assert err.value.field == field
    cfg = TrainConfig(steps=1, progress=False)
    with pytest.raises(OptionsError, match="options must be a RagOptions"):  # the object, never a dict
        rag_job.run_rag(str(tiny), tmp_path / "o", cfg, options=bad)
    with pytest.raises(OptionsError, match="more than the 184 passages") as err:
        rag_job.run_rag(str(tiny), tmp_path / "o", cfg, generator="bart-tiny", options=RagOptions(k=185))
    assert err.value.field == "k" and not (tmp_path / "o" / "checkpoints").exists()


def test_the_generators_tokens_in_one_pass_are_bounded_jointly_before_any_work(tiny, tmp_path):
    from lmforge.retrieval.job_options import MAX_GENERATOR_TOKENS, check_rag_cost, generator_tokens

    # RAG-Sequence's Thorough Decoding scores k x k x num_beams candidate rows of one question at once
    thorough = RagOptions(kind="sequence", k=200, num_beams=8, max_len=64, max_new_tokens=8)
    # the larger of training's pass (answers of 16 pieces) and decoding's (max_new_tokens, with its beams)
    assert generator_tokens(thorough, 1) == 200 * 200 * 8 * (64 + 8) > MAX_GENERATOR_TOKENS
    fast = RagOptions(kind="sequence", decoding="fast", k=200, num_beams=8, max_len=64, max_new_tokens=8)
    assert generator_tokens(fast, 1) == 200 * 8 * (64 + 8) <= MAX_GENERATOR_TOKENS
    assert generator_tokens(RagOptions(k=0, max_new_tokens=20), 32) == 32 * (96 + 20)  # closed-book: one row
    assert generator_tokens(RagOptions(k=10, max_new_tokens=2), 32) == 320 * (96 + 16)  # training's answers
    check_rag_cost(RagOptions(k=16, num_beams=8, max_len=64), 32, vocab_size=50_265)  # each pass fits
    # within the tokens, the answer scores over the vocabulary are bounded once the generator is known
    wide = RagOptions(k=100, max_len=16, max_new_tokens=1)
    check_rag_cost(wide, 1024)
    with pytest.raises(OptionsError, match="scores of answer tokens over the generator's 30,000 ids") as err:
        check_rag_cost(wide, 1024, vocab_size=30_000)
    assert err.value.field == "k"
    with pytest.raises(OptionsError, match="generator tokens in one pass") as err:
        rag_job.run_rag(str(tiny), tmp_path / "o", TrainConfig(steps=1), generator="bart-tiny",
                        options=thorough)
    assert err.value.field == "k" and not (tmp_path / "o").exists()


def test_an_out_that_is_an_input_is_refused_before_any_work(tiny, tmp_path, capsys):
    from lmforge.utils.atomic import UnsafePath

    with pytest.raises(UnsafePath, match="the input") as err:
        rag_job.run_rag(str(tiny), tiny, TrainConfig(steps=1))
    assert err.value.field == "out"
    assert main(["retrieve", "rag", "--retriever", str(tiny), "--out", str(tiny)]) == 2
    assert "--retriever" in capsys.readouterr().err
    assert sorted(p.name for p in tiny.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                      "tokenizer_config.json"]


def test_an_out_inside_an_input_model_folder_is_refused(tiny, tmp_path):
    """OUT/passage inside a retriever made it read as a two-encoder retriever with no retriever.json."""
    from lmforge.utils.atomic import UnsafePath

    with pytest.raises(UnsafePath, match="lies inside the input retriever") as err:
        rag_job.run_rag(str(tiny), tiny / "passage", TrainConfig(steps=1))
    assert err.value.field == "out" and not (tiny / "passage").exists()


def test_a_generator_without_a_decoder_start_starts_from_cls(tiny, tmp_path):
    """A hand-built BART (no decoder_start_token_id) had failed in collate with a TypeError."""
    from lmforge.retrieval.rag_train import RAGObjective

    encoder = BiEncoder.from_dir(tiny)
    tok = encoder.tokenizer
    generator = lmforge.build("bart-base", n_layers=1, n_decoder_layers=1, d_model=32, n_heads=2, d_ff=64,
                              vocab_size=tok.vocab_size, max_seq_len=64)
    assert generator.config.decoder_start_token_id is None
    vectors = torch.zeros(3, encoder.width)
    objective = RAGObjective(generator, encoder, vectors, [[5], [6], [7]], 1, tokenizer=tok)
    assert objective.start == tok.special_id("cls") == generator.config.decoder_start_token_id



@pytest.mark.parametrize("resume", [False, True])
def test_an_out_holding_a_run_s_checkpoints_is_refused_naming_out_before_the_retriever_is_read(
        tmp_path, capsys, resume):
    """A run not resumed there was refused only by Trainer.fit, once the retriever, the generator and the
    questions were read (here the missing retriever was the error said); a resume gets past the check."""
    from lmforge.utils.atomic import UnsafePath

    out, retriever = tmp_path / "run", tmp_path / "missing"
    (out / "checkpoints" / "step-0000002").mkdir(parents=True)
    with pytest.raises(Exception) as err:
        rag_job.run_rag(str(retriever), out, TrainConfig(steps=1), resume=resume)
    said = f"out {out} already holds a run's checkpoints: pass resume=True (--resume) to continue it, or"
    assert (f"{retriever} is neither a model" in str(err.value) if resume else
            isinstance(err.value, UnsafePath) and err.value.field == "out"
            and str(err.value) == f"{said} another folder")
    assert main(["retrieve", "rag", "--retriever", str(retriever), "--out", str(out),
                 *(["--resume"] if resume else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (f"--retriever {retriever}" in err if resume else
                                     err == f"lmforge retrieve rag: error: --{said} another folder\n")
