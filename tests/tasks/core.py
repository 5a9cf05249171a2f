"""Shared by the tasks-core tests: a tokenizer of the built-in sentiment task and tiny models."""
import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import lmforge
from lmforge.tasks.formats import builtin
from lmforge.tokenizer import train_tokenizer


@functools.lru_cache(maxsize=None)
def sentiment(n: int = 200) -> dict:
    """Splits of the built-in sentiment task (canonical records)."""
    return builtin("sentiment", n, 0)[1]


@functools.lru_cache(maxsize=None)
def _tokenizer(family: str):
    kind = {"bert": "wordpiece", "t5": "unigram"}.get(family, "bpe")
    texts = [r["text"] for r in sentiment()["train"]]
    if family == "t5":  # text-to-text regression targets are numbers ("3.8")
        texts.append(" ".join(f"{k / 5:.1f}" for k in range(26)))
    return train_tokenizer(texts, kind, 300, family=family)


def tokenizer(family: str = "bert"):
    """A small WordPiece (bert), unigram (t5) or byte-level BPE (gpt2, roberta) tokenizer of the
    sentiment texts."""
    return _tokenizer(family)


def tiny(preset: str = "bert-base", seed: int = 0, **overrides):
    """A seeded tiny model of `preset` that fits the test tokenizers."""
    torch.manual_seed(seed)
    return lmforge.build(lmforge.tiny(preset, vocab_size=320, max_seq_len=128, **overrides))


def quiet(*args) -> None:
    """A log that says nothing."""


def cfg(**kw):
    """A short fine-tuning run's TrainConfig (4 constant-lr steps of 8, no progress bar); `kw` over it."""
    from lmforge.train import TrainConfig

    base = {"steps": 4, "batch_size": 8, "lr": 3e-3, "warmup": 0, "schedule": "constant", "log_every": 1,
            "progress": False}
    return TrainConfig(**{**base, **kw})


def fine_tuned_sentiment(out):
    """(directory, splits): a tiny BERT fine-tuned 60 steps on 400 sentiment records, saved with task.json."""
    # four test files read this same seeded run: it is trained once a process and each caller gets a copy
    # of its own (in `out`), which it may change
    shutil.copytree(_fine_tuned_sentiment_run(), out, dirs_exist_ok=True)
    return out / "final", sentiment(400)


@functools.lru_cache(maxsize=None)
def _fine_tuned_sentiment_run() -> Path:
    from lmforge.tasks.finetune import TaskConfig, finetune
    from lmforge.train import TrainConfig

    out = Path(tempfile.mkdtemp(prefix="lmforge-sst-")) / "run"
    atexit.register(shutil.rmtree, out.parent, True)
    data = sentiment(400)
    finetune(tiny("bert-base", n_layers=2, n_heads=4), tokenizer(), "cls", data["train"], data["validation"],
             out, TrainConfig(steps=60, batch_size=16, lr=3e-3, seed=0, log_every=100), TaskConfig(),
             log=lambda *a: None)
    return out


def saved_lm(path, preset: str = "gpt2", family: str = "gpt2"):
    """A tiny `preset` with an (untrained) LM head, seeded, saved in `path` with its `family` tokenizer."""
    from lmforge.heads import attach

    tok = tokenizer(family)
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(preset, vocab_size=tok.vocab_size))
    attach(model, "lm")
    model.save(path)
    tok.save(path)
    return path


def saved_classifier(path, preset: str, family: str, records: list, max_len: int):
    """A tiny two-layer `preset` with an untrained cls head for `records`' labels, saved in `path` with its
    `family` tokenizer and task.json (no training: for refusals made before any work)."""
    from lmforge.tasks.finetune import TaskConfig, make_task, save_model

    save_model(make_task("cls", tiny(preset, n_layers=2, n_heads=4), tokenizer(family), records,
                         TaskConfig(max_len=max_len)), path)
    return path


@pytest.fixture(autouse=True)
def no_loss_plot(monkeypatch):
    """Training runs in the folders whose conftest imports this draw no loss.png: matplotlib costs
    0.2-0.4 s a run there and no test of theirs reads the plot (tests/train and tests/test_pretrain draw
    and check it); metrics.jsonl is still read, as the plot would read it."""
    from lmforge.train import loop
    from lmforge.train.log import read_metrics

    monkeypatch.setattr(loop, "plot_losses", lambda metrics, png, title="": read_metrics(metrics) and None)
