"""Continued pretraining of a loaded checkpoint (`lmforge pretrain --model DIR`): its own tokenizer and
weights, a missing LM head initialised from the seed, domain words added to the vocabulary."""
import json
import math

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.data import corpus_text
from lmforge.heads import attach
from lmforge.io import find_model_dir
from lmforge.tokenizer import load_tokenizer, train_tokenizer
from lmforge.train.pretrain import add_words

MINILM = "all-MiniLM-L6-v2"
TEXT = ("Immunotherapy trains the immune system against tumours. Pharmacokinetics describes drug levels.\n"
        "The trial measured pharmacokinetics in adults. Immunotherapy was given every week.\n\n"
        "Clearance of the drug was slow. Doctors compared immunotherapy with chemotherapy.\n")
WORDS = ["immunotherapy", "Pharmacokinetics", "the", "immunotherapy"]  # "the" is one token already
TINY = ["batch_size=2", "max_len=32", "progress=false", "log_every=1"]


def _minilm():
    try:
        return find_model_dir(MINILM)
    except ValueError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def continued(tmp_path_factory):
    """all-MiniLM-L6-v2 (no LM head) pretrained further for 2 steps with two domain words added."""
    _minilm()
    root = tmp_path_factory.mktemp("continue")
    (root / "domain.txt").write_text(TEXT)
    (root / "words.txt").write_text("\n".join(WORDS) + "\n\n")
    out = root / "run"
    assert main(["pretrain", "--model", MINILM, "--objective", "mlm", "--data", str(root / "domain.txt"),
                 "--out", str(out), "--steps", "2", "--add-tokens", str(root / "words.txt"), *TINY]) == 0
    return out


@pytest.mark.slow  # a real 22M-parameter checkpoint's run; a tiny one's below is in the default suite
def test_continued_pretraining_trains_the_checkpoint_with_a_new_lm_head(continued):
    losses = [json.loads(line)["loss"] for line in (continued / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    model, tokenizer = lmforge.load(continued / "final"), load_tokenizer(continued / "final")
    assert {"lm", "pooler"} <= set(model.heads)
    assert model.heads["lm"].projection()[0] is model.tokens.weight  # BERT ties its MLM head
    assert model.config.vocab_size == tokenizer.vocab_size == load_tokenizer(_minilm()).vocab_size + 2
    ids = tokenizer.encode("Immunotherapy and pharmacokinetics", add_special_tokens=False).ids
    assert ids[0] == tokenizer.token_to_id("immunotherapy") and \
        ids[2] == tokenizer.token_to_id("pharmacokinetics")
    assert len(ids) == 3 and min(ids[0], ids[2]) >= tokenizer.vocab_size - 2


def test_a_tiny_checkpoint_without_an_lm_head_is_trained_with_a_new_tied_one(tmp_path):
    """The MiniLM test's checks on a tiny BERT of no heads (a cased tokenizer: words stay as written)."""
    lines = [line for line in corpus_text(40, seed=0).splitlines() if line.strip()]
    tokenizer = train_tokenizer(lines, "wordpiece", 150, family="bert")
    torch.manual_seed(0)
    bare = lmforge.build(lmforge.tiny("bert-tiny", vocab_size=tokenizer.vocab_size, n_layers=1, d_model=32,
                                      n_heads=2, d_ff=64, max_seq_len=64))
    assert not bare.heads
    bare.save(tmp_path / "bare")
    tokenizer.save(tmp_path / "bare")
    out = tmp_path / "run"
    assert main(["pretrain", "--model", str(tmp_path / "bare"), "--objective", "mlm", "--data",
                 str(_write(tmp_path / "domain.txt", TEXT)), "--out", str(out), "--steps", "2",
                 "--add-tokens", str(_write(tmp_path / "words.txt", "\n".join(WORDS) + "\n\n")), *TINY]) == 0
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    model, grown = lmforge.load(out / "final"), load_tokenizer(out / "final")
    assert "lm" in model.heads and model.heads["lm"].projection()[0] is model.tokens.weight  # tied
    assert model.config.vocab_size == grown.vocab_size == tokenizer.vocab_size + 2  # "the" was one token
    ids = grown.encode("immunotherapy and Pharmacokinetics", add_special_tokens=False).ids
    assert ids[0] == grown.token_to_id("immunotherapy") and ids[-1] == grown.token_to_id("Pharmacokinetics")
    assert min(ids[0], ids[-1]) >= grown.vocab_size - 2


@pytest.mark.slow  # an end-to-end run through the command line
def test_the_continued_model_fine_tunes_and_fills_masks(continued, tmp_path, capsys):
    assert main(["finetune", "--model", str(continued / "final"), "--builtin", "sentiment",
                 "--builtin-size", "20", "--out", str(tmp_path / "ft"), "--steps", "2", "batch_size=2",
                 "max_len=32", "progress=false"]) == 0
    assert (tmp_path / "ft" / "final" / "model.safetensors").is_file()
    capsys.readouterr()
    assert main(["fill-mask", "--model", str(continued / "final"), "The patient received [MASK].",
                 "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5


def _tiny_bert(tie: bool):
    lines = [line for line in corpus_text(40, seed=0).splitlines() if line.strip()]
    tokenizer = train_tokenizer(lines, "wordpiece", 150, family="bert")
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-tiny", vocab_size=160, tie_embeddings=tie))
    attach(model, "lm")
    return model, tokenizer


@pytest.mark.parametrize("tie", [True, False])
def test_new_embeddings_are_the_means_of_their_old_subwords(tie):
    model, tokenizer = _tiny_bert(tie)
    words = ["riverbankment", "Tosk", "zyxwvut"]
    pieces = {w: tokenizer.encode(w, add_special_tokens=False).ids for w in words}
    assert all(len(p) > 1 for p in pieces.values())
    head = model.heads["lm"]
    table, out = model.tokens.weight.detach().clone(), head.projection()[0].detach().clone()
    bias = head.bias.detach().clone()
    old_size = tokenizer.vocab_size
    added = add_words(model, tokenizer, words + ["riverbankment"])
    assert added == words  # repeats once (a cased tokenizer: MiniLM's lower-cases them, test above)
    # the model had 160 rows for 150 ids: the new ids take unused rows, so nothing grows
    assert tokenizer.vocab_size == old_size + 3 and model.config.vocab_size == 160
    for word, ids in pieces.items():
        (row,) = tokenizer.encode(word, add_special_tokens=False).ids
        assert row >= old_size
        assert torch.allclose(model.tokens.weight[row], table[ids].mean(0))
        assert torch.allclose(head.projection()[0][row], out[ids].mean(0))
        assert torch.allclose(head.bias[row], bias[ids].mean())
    assert torch.equal(model.tokens.weight[:old_size], table[:old_size])  # old rows kept
    assert tokenizer.encode("riverbankmentx", add_special_tokens=False).ids[0] != tokenizer.token_to_id(
        "riverbankment")  # a domain word inside a longer word is not cut out of it


def test_adding_words_grows_a_full_table():
    model, tokenizer = _tiny_bert(False)
    model = lmforge.build(lmforge.tiny("bert-tiny", vocab_size=tokenizer.vocab_size, tie_embeddings=False))
    attach(model, "lm")
    add_words(model, tokenizer, ["riverbankment", "tosk"])
    assert model.config.vocab_size == tokenizer.vocab_size == model.tokens.weight.shape[0]
    assert model.heads["lm"].projection()[0].shape[0] == model.heads["lm"].bias.shape[0] == \
        tokenizer.vocab_size
    ids = torch.tensor([tokenizer.encode("tosk riverbankment").ids])
    assert model(ids).logits.shape == (1, ids.shape[1], tokenizer.vocab_size)


FIELDS = ["n_layers=1", "d_model=32", "n_heads=2", "d_ff=64", "max_seq_len=64"]


def _base(root) -> list:
    """A one-step MLM run's arguments on TEXT, its batch size and progress from a --config file."""
    return ["pretrain", "--objective", "mlm", "--steps", "1", "--data", str(_write(root / "t.txt", TEXT)),
            "--config", str(_write(root / "c.json", '{"batch_size": 2, "progress": false}'))]


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A tiny BERT of our own pretrained one step on TEXT (read only by the tests: they write elsewhere)."""
    root = tmp_path_factory.mktemp("own")
    assert main([*_base(root), *FIELDS, "--preset", "bert-tiny", "--out", str(root / "run")]) == 0
    return root / "run"


def test_bad_requests_exit_2(own, tmp_path, capsys):
    run, base, fields = own, _base(tmp_path), FIELDS
    assert main([*base, *fields, "--preset", str(run / "final"), "--out", str(tmp_path / "a")]) == 2
    assert f"--model {run / 'final'}" in capsys.readouterr().err  # a directory is not a preset
    assert main([*base, "--preset", "bert-tiny", "--model", str(run / "final"),
                 "--out", str(tmp_path / "b")]) == 2
    assert "give one of --preset" in capsys.readouterr().err
    assert main([*base, *fields, "--model", str(run / "final"), "--out", str(tmp_path / "c")]) == 2
    assert "apply to --preset only" in capsys.readouterr().err
    (tmp_path / "w.txt").write_text("two words\n")
    assert main([*base, *fields, "--preset", "bert-tiny", "--add-tokens", str(tmp_path / "w.txt"),
                 "--out", "x"]) == 2
    assert "--model" in capsys.readouterr().err
    assert main([*base, "add_tokens=" + str(tmp_path / "w.txt"), "--model", str(run / "final"),
                 "--out", str(tmp_path / "d")]) == 2
    assert "not one word" in capsys.readouterr().err
    assert main([*base, "--model", "bert-tiny", "--out", str(tmp_path / "e")]) == 2
    assert "is a preset" in capsys.readouterr().err


def test_continuing_a_run_of_our_own_and_resuming_it(own, tmp_path):
    first, second = own, tmp_path / "second"
    tiny = ["batch_size=2", "progress=false", "max_len=32"]
    data = ["--data", str(_write(tmp_path / "t.txt", TEXT))]
    start = lmforge.load(first / "final").state_dict()
    args = ["pretrain", "--model", str(first / "final"), "--objective", "mlm", "--out", str(second), *tiny,
            "lr=0.01", *data]
    assert main([*args, "--steps", "1"]) == 0
    assert main([*args, "--steps", "2", "--resume"]) == 0
    assert json.loads((second / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2
    after = lmforge.load(second / "final").state_dict()
    assert set(after) == set(start) and not torch.equal(after["tokens.weight"], start["tokens.weight"])
    assert load_tokenizer(second / "final").vocab_size == load_tokenizer(first / "final").vocab_size


def _write(path, text):
    path.write_text(text)
    return path
