"""The models a server holds: each a directory loaded once, with what it can do.

A served model is read as the library reads it elsewhere: SentenceEncoder.from_dir (the model,
its tokenizer and its sentence-transformers pooling), and where the directory holds task.json
the fine-tuned task rebuilt from it as `lmforge evaluate` rebuilds it (a Hugging Face classifier's from
its config.json: served_task). Its capabilities follow
from its architecture and heads: every model embeds and gives its contextual features; a reranker
(task.json kind rerank) reranks; a masked-LM encoder, T5 or BART fills
masks; a decoder or encoder-decoder with an LM head generates; a fine-tuned model predicts; every
Transformer shows its attention. ELMo (a directory of architecture "elmo") has no tokenizer: it reads
whitespace-separated words, as lmforge.features does offline, so it serves its features alone, its
tokens (counted for the limits, cut by truncate) being words.

Two tokenizers per model: the workers' (Tokenizer.encode with max_length switches the backend's
truncation on and off, under a lock, so the workers may share it) and the event loop's own copy
for counting tokens, /tokenize and turning streamed ids into text, which never waits on that lock.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lmforge.pipelines.embed import SentenceEncoder
from lmforge.pipelines.rerank import Reranker
from lmforge.compress.quantize import COUNTED, parameter_count
from lmforge.generate import lm_head_name
from lmforge.io.native import read_meta
from lmforge.io.resolve import find_model_dir
from lmforge.tasks.base import Task
from lmforge.tasks.finetune import TaskConfig, make_task, task_info
from lmforge.tasks.reference import check_head, check_scored, default_labels, saved_options
from lmforge.tokenizer import Tokenizer, load_tokenizer

_WORD = re.compile(r"\S+")  # ELMo's tokens, as analysis/text_features.py splits them
CAPABILITIES = ("embed", "features", "rerank", "predict", "fill_mask", "generate", "tokenize", "attention")
ATTENTIONAL = ("encoder", "decoder", "encoder-decoder")  # the architectures analysis/attention.py reads


@dataclass
class ServedModel:
    """One model directory, loaded: the encoder (model + tokenizer + pooling), its task if fine-tuned."""

    name: str
    path: Path
    encoder: SentenceEncoder | None  # None for a model of words (ServedWords)
    front: Tokenizer | None  # the event loop's copy of the tokenizer
    task: Task | None = None
    info: dict = field(default_factory=dict)  # task.json
    capabilities: tuple = ()
    score: Callable = float  # a reranker's logit -> its score (its task's activation: lmforge.rerank's)

    @property
    def model(self):
        """The Transformer."""
        return self.encoder.model

    @property
    def tokenizer(self) -> Tokenizer:
        """The worker's tokenizer."""
        return self.encoder.tokenizer

    @property
    def max_tokens(self) -> int:
        """The most tokens one text may have (longer ones are truncated or refused)."""
        cfg = self.model.config  # as SentenceEncoder limits them, and never past the positions
        own = self.encoder.max_length or self.tokenizer.model_max_length or cfg.max_seq_len
        return min(cfg.max_seq_len, own)

    @property
    def feature_width(self) -> int:
        """The width of one hidden state /features gives."""
        return self.model.config.d_model

    def count(self, texts: list, pair: list | None = None) -> list:
        """Tokens of each text (specials included), with the event loop's tokenizer."""
        return [len(self.front.encode(t, None if pair is None else pair[i]).ids) for i, t in enumerate(texts)]

    def describe(self) -> dict:
        """What /info says about the model: its name and sizes, never where it lies on disk."""
        cfg, pooling = self.model.config, list(self.encoder.pooling) if self.encoder is not None else []
        return {"name": self.name, "architecture": cfg.architecture,
                "capabilities": list(self.capabilities), "max_tokens": self.max_tokens,
                "parameters": parameter_count(self.model), "parameters_counted": COUNTED,
                "n_layers": cfg.n_layers, "d_model": cfg.d_model, "vocab_size": cfg.vocab_size,
                "embedding_dim": cfg.d_model * len(pooling) if pooling else None,
                "task": self.info or None, "pooling": pooling, "config": cfg.to_dict()}


@dataclass
class ServedWords(ServedModel):
    """A model that reads whitespace-separated words (ELMo): no tokenizer, no sentence encoder; its
    tokens are words, its features [h-> ; h<-] (2 d_model wide)."""

    words_model: object = None

    @property
    def model(self):
        """The biLM."""
        return self.words_model

    @property
    def tokenizer(self) -> None:
        """None: the model reads characters of words."""
        return None

    @property
    def max_tokens(self) -> int:
        """The most words one text may have (lmforge.features' default max_length)."""
        return self.model.config.max_seq_len

    @property
    def feature_width(self) -> int:
        """Each layer is [forward ; backward] states."""
        return 2 * self.model.config.d_model

    def count(self, texts: list, pair: list | None = None) -> list:
        """Words of each text."""
        return [sum(1 for _ in _WORD.finditer(t)) for t in texts]


def _has_lm_head(model) -> bool:
    try:
        lm_head_name(model)
    except ValueError:
        return False
    return True


def capabilities_of(model, task: Task | None) -> tuple:
    """What a model can serve (see the module docstring)."""
    if hasattr(model, "word_layers"):  # ELMo: features of words, nothing that needs a tokenizer
        return ("features",)
    arch, lm = model.config.architecture, _has_lm_head(model)
    found = {"embed", "tokenize", *(("attention", "features") if arch in ATTENTIONAL else ())}
    if task is not None:
        found.add("rerank" if task.kind == "rerank" else "predict")
    if lm and arch in ("encoder", "encoder-decoder"):
        found.add("fill_mask")
    if lm and arch in ("decoder", "encoder-decoder"):
        found.add("generate")
    return tuple(c for c in CAPABILITIES if c in found)


def rebuild_task(path: Path, model, tokenizer, info: dict) -> Task:
    """The fine-tuned task of a directory's task.json around its model (as tasks.finetune.evaluate
    rebuilds it); an error when the model lacks the task's trained head."""
    kind = info["kind"]
    # as fine_tuned_task reads it; a served task.json without max_len: 128 tokens (TaskConfig's default)
    cfg = TaskConfig(**saved_options(path, info, kind, 128))
    pretrained = {id(head) for head in model.heads.values()}
    task = make_task(kind, model, tokenizer, [], cfg, info.get("labels"))
    if task.head != "lm" and id(task.task_head) not in pretrained:
        raise ValueError(f"{path}: task.json says {kind}, but the model has no trained {task.head} head")
    return task.eval()


def served_task(path: Path) -> dict:
    """The task a directory serves: its task.json, or a Hugging Face classifier's as its config.json
    says (tasks/reference.py: the first kind its head is read as, its id2label or class ids), as a
    reference server (text-embeddings-inference's /predict) reads it; {} for neither."""
    info = task_info(path)
    if info.get("kind") or not info.get("kinds"):
        return info if info.get("kind") else {}
    labels = info.get("labels") or default_labels(str(path), info, None)
    kept = {"labels": labels, "activation": info.get("activation")}  # a CrossEncoder's score, as it reads it
    return {"kind": info["kinds"][0], **{k: v for k, v in kept.items() if v}}


def load_served(name: str, where: str | os.PathLike) -> ServedModel:
    """Load the model directory (or installed model package) `where` as `name`."""
    path = find_model_dir(where)
    if read_meta(path).get("config", {}).get("architecture") == "elmo":
        return load_words(name, path)
    info = served_task(path)
    if info.get("kind"):  # a CrossEncoder's Tanh, a task.json beside a model without its head: refused
        check_scored(path, info, info["kind"])  # before the weights are read (as fine_tuned_task)
        check_head(path, info, info["kind"], str(path))
    encoder = SentenceEncoder.from_dir(path)
    task = rebuild_task(path, encoder.model, encoder.tokenizer, info) if info.get("kind") else None
    encoder.model.eval()
    score = Reranker(task).score if task is not None and task.kind == "rerank" else float
    return ServedModel(name, path, encoder, load_tokenizer(path), task, info,
                       capabilities_of(encoder.model, task), score)


def load_words(name: str, path: Path) -> ServedWords:
    """An ELMo directory, loaded (optimized) as `lmforge features` loads it."""
    from lmforge.analysis.text_features import load_for_features

    model, _ = load_for_features(path)
    return ServedWords(name, path, None, None, capabilities=capabilities_of(model, None), words_model=model)


def parse_model_specs(specs: list) -> list:
    """--model values, DIR or NAME=DIR, as (name, where) pairs; names default to the directory's
    name and must be unique."""
    out, seen = [], set()
    for spec in specs:
        name, eq, where = str(spec).partition("=")
        if not eq or os.path.isdir(spec):  # a directory whose own name holds "=" is a directory
            name, where = Path(str(spec).rstrip("/")).name or str(spec), str(spec)
        if not name or not where:
            raise ValueError(f"--model {spec!r}: expected DIR or NAME=DIR")
        if name in seen:
            raise ValueError(f"--model {spec!r}: the name {name!r} is given twice (use NAME=DIR)")
        seen.add(name)
        out.append((name, where))
    return out
