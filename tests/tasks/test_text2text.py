"""Text-to-text fine-tuning of encoder-decoders: the choice, T5's input and target texts, rank
classification against log-likelihoods computed by hand, label errors, and a tiny T5 that learns."""
import json
import random

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.tasks.finetune import TaskConfig, make_task
from lmforge.tasks.text2text import CLASSES, choose, round_value
from tests.tasks.core import tiny, tokenizer

FAST = ["batch_size=16", "lr=1e-2", "warmup=0", "progress=false", "eval_every=10"]


def t5(seed: int = 0, **overrides):
    """A tiny T5 whose special ids are those of the t5 test tokenizer (<pad> 0, </s> 1)."""
    return tiny("t5-small", seed, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, **overrides)


def task(kind="cls", labels=("negative", "positive"), model=None, **kw):
    return CLASSES[kind](model or t5(), tokenizer("t5"), labels=list(labels), **kw)


def test_t5_is_text_to_text_bart_keeps_its_head_unless_asked():
    bart, bert = tiny("bart-base"), tiny()
    assert choose("cls", t5(), None) and choose("regression", t5(), None)
    assert not choose("cls", bart, None) and choose("pair", bart, True)
    assert not choose("cls", bert, None) and not choose("choice", t5(), None)
    assert not choose("cls", t5(), False)
    with pytest.raises(ValueError, match="needs an encoder-decoder"):
        choose("cls", bert, True)
    with pytest.raises(ValueError, match="'tagging' has no text-to-text form"):
        choose("tagging", t5(), True)
    train = [{"text": "It is superb.", "label": "positive"}, {"text": "It broke.", "label": "negative"}]
    made = make_task("cls", t5(), tokenizer("t5"), train, TaskConfig())
    assert type(made).__name__ == "TextClassificationTask" and list(made.model.heads) == ["lm"]
    made = make_task("cls", bart, tokenizer("roberta"), train, TaskConfig())
    assert list(made.model.heads) == ["classification"] and made.info()["text_to_text"] is False


def test_inputs_and_targets_are_t5_texts():
    tok = tokenizer("t5")
    single = task(prefix="sst2")
    (ex,) = single.encode({"text": "It is superb.", "label": "positive"})
    assert ex["input_ids"] == tok.encode("sst2 sentence: It is superb.").ids
    assert ex["labels"] == tok.encode("positive").ids and ex["labels"][-1] == tok.eos_id
    pair = task("pair")
    (ex,) = pair.encode({"text": "It is superb.", "text_pair": "I like it.", "label": "negative"})
    assert ex["input_ids"] == tok.encode("pair sentence1: It is superb. sentence2: I like it.").ids
    batch = pair.collate(pair.encode_all([{"text": "a", "text_pair": "b", "label": "negative"}]))
    target = tok.encode("negative").ids
    assert batch["decoder_input_ids"].tolist() == [[0, *target[:-1]]]  # T5 starts the decoder at <pad>
    assert single.info() == {"kind": "cls", "labels": ["negative", "positive"], "max_len": 128,
                             "text_to_text": True, "prefix": "sst2"}


def test_regression_targets_round_to_a_fifth_as_t5():
    rounded = [round_value(v) for v in (2, 0.29, 0.31, 3.87, -0.01, 5)]
    assert rounded == ["2.0", "0.2", "0.4", "3.8", "0.0", "5.0"]
    records = [{"text": "a", "label": 4.93}, {"text": "b", "label": 0.04}, {"text": "c", "label": 2.1}]
    labels = CLASSES["regression"].labels_from(records)
    assert labels == ["0.0", "2.0", "5.0"]
    reg = task("regression", labels)
    (ex,) = reg.encode(records[0])
    assert ex["labels"] == tokenizer("t5").encode("5.0").ids


def hand_scores(t, record) -> list:
    """log p(target | source) of every label by a full forward pass per label."""
    lm, start = t.model.heads["lm"], t.model.config.decoder_start_token_id
    source = torch.tensor([t.encode({**record, "label": None})[0]["input_ids"]])
    out = []
    for target in t.targets:
        decoder_in = torch.tensor([[start, *target[:-1]]])
        hidden = t.model(source, decoder_input_ids=decoder_in, run_heads=False).last_hidden_state
        logp = lm(hidden)[0].log_softmax(-1)
        out.append(sum(logp[k, token].item() for k, token in enumerate(target)))
    return out


def test_rank_classification_is_the_argmax_of_label_log_likelihoods():
    t = task(labels=["superb", "It broke", "want my money back"], model=t5(seed=3)).eval()
    records = [{"text": "It is superb.", "label": "superb"},
               {"text": "It broke after a week.", "label": "It broke"},
               {"text": "I want my money back now.", "label": "superb"}]
    outputs = t.outputs(t.encode_all(records), batch_size=2)  # padding within a batch changes nothing
    for record, scores in zip(records, outputs):
        expected = hand_scores(t, record)
        assert scores == pytest.approx(expected, abs=1e-4)
    predictions, metrics = t.evaluate(records)
    assert predictions == [t.labels[max(range(3), key=s.__getitem__)] for s in outputs]
    assert list(metrics) == ["accuracy", "f1", "matthews"]


@pytest.mark.parametrize("labels, message", [
    (["positive", " "], "label ' ' is empty"),
    (["positive", ""], "label '' is empty"),
    (["positive", "\u2603"], "label '\u2603' has text the tokenizer does not know \\('\u2603'\\)"),
    (["positive", "positive "], "labels 'positive' and 'positive ' encode to the same target"),
    ([], "needs the list of labels"),
])
def test_bad_labels_are_clear_errors(labels, message):
    with pytest.raises(ValueError, match=message):
        task(labels=labels)


def test_a_decoder_cannot_be_text_to_text():
    with pytest.raises(ValueError, match="needs an encoder-decoder, not a decoder"):
        CLASSES["cls"](tiny("gpt2"), tokenizer("gpt2"), labels=["a", "b"])


def separable(n: int, seed: int) -> str:
    """CSV of a trivially separable task: the review's verdict word decides the label."""
    rng, words = random.Random(seed), ["It", "is", "the", "camera", "I", "bought", "last", "week"]
    rows = ["text,label"]
    for _ in range(n):
        good = rng.random() < 0.5
        filler = " ".join(rng.choice(words) for _ in range(3))
        rows.append(f"{filler} {'superb' if good else 'broke'},{'yes' if good else 'no'}")
    return "\n".join(rows) + "\n"


@pytest.mark.slow  # an end-to-end run through the command line
def test_tiny_t5_learns_text_to_text_through_the_cli(tmp_path, capsys):
    model_dir = tmp_path / "t5"
    t5(n_layers=1, d_model=64, d_ff=128).save(model_dir)
    tokenizer("t5").save(model_dir)
    (tmp_path / "train.csv").write_text(separable(128, 0))
    (tmp_path / "valid.csv").write_text(separable(40, 1))
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(model_dir), "--task", "cls", "--train",
                 str(tmp_path / "train.csv"), "--valid", str(tmp_path / "valid.csv"), "--out", str(out),
                 "--steps", "80", *FAST]) == 0
    # (at 40 steps it sat on the label prior, loss ln 2 / 2, for some dropout draws: without dropout,
    # hidden dropout only, and a GPU's random stream; bench/results/borrowed_h200)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best"]["accuracy"] >= 0.9  # chance is 0.5
    info = json.loads((out / "best" / "task.json").read_text())
    assert info["text_to_text"] is True and info["labels"] == ["no", "yes"]
    # the start id it decoded from is kept, so `lmforge generate` starts where training did
    assert lmforge.load(out / "best").config.decoder_start_token_id == tokenizer("t5").pad_id
    lmforge.load(out / "best").save(tmp_path / "hf", format="hf")  # exports as T5ForConditionalGeneration
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["architectures"] == ["T5ForConditionalGeneration"]
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out / "best"), "--data", str(tmp_path / "valid.csv"),
                 "--out", str(tmp_path / "pred.jsonl")]) == 0
    printed = capsys.readouterr().out
    result = json.loads(printed[printed.index("{"):printed.rindex("}") + 1])
    assert result["accuracy"] == summary["best"]["accuracy"]
    rows = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert {r["prediction"] for r in rows} <= {"no", "yes"}


def test_regression_and_bart_option_train_and_predict_values(tmp_path):
    from lmforge.tasks.finetune import evaluate, finetune
    from lmforge.train import TrainConfig

    records = [{"text": "It is superb.", "label": 4.93}, {"text": "It broke.", "label": 0.04},
               {"text": "It is fine.", "label": 2.1}]
    cfg = TrainConfig(steps=2, batch_size=3, lr=1e-3, warmup=0, progress=False)
    summary = finetune(t5(), tokenizer("t5"), "regression", records, records, tmp_path / "reg", cfg,
                       log=lambda *a: None)
    assert summary["primary"] == "pearson"
    info = json.loads((tmp_path / "reg" / "final" / "task.json").read_text())
    assert info["labels"] == ["0.0", "2.0", "5.0"] and info["text_to_text"] is True
    metrics = evaluate(tmp_path / "reg" / "final", records, out=tmp_path / "reg.jsonl")
    lines = (tmp_path / "reg.jsonl").read_text().splitlines()
    predictions = [json.loads(line)["prediction"] for line in lines]
    assert set(predictions) <= {0.0, 2.0, 5.0} and "pearson" in metrics
    bart = tiny("bart-base", pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    labelled = [{**r, "label": str(r["label"] > 2)} for r in records]
    finetune(bart, tokenizer("roberta"), "cls", labelled, None, tmp_path / "bart", cfg,
             TaskConfig(text_to_text=True), log=lambda *a: None)
    assert list(lmforge.load(tmp_path / "bart" / "final").heads) == ["lm"]
