"""Pretraining recipes: corpus -> tokenizer -> examples -> objective -> Trainer.

`pretrain(...)` is what `lmforge pretrain` runs: the built-in corpus unless text files
are given, a tokenizer trained on it unless one is given, the examples the objective
needs (MLM: packed sentences; NSP/SOP: sentence pairs; CLM: contiguous blocks), and the
one training loop. The tokenizer is saved next to the model (DIR/final) so the result
is a complete, loadable model directory.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from lmforge.data.examples import blocks, nsp_pairs, pack_sentences, sop_pairs, sso_pairs
from lmforge.data.synthetic import documents
from lmforge.model import from_config
from lmforge.objectives import (CausalLM, MaskedLM, PairMLM, ReplacedTokenDetection, SpanMLM,
                                StructuralMLM)
from lmforge.presets import get_config
from lmforge.train import TrainConfig, Trainer

OBJECTIVES = ("mlm", "wwm", "nsp", "sop", "span", "structural", "rtd", "clm")
PAIRS = {"nsp": nsp_pairs, "sop": sop_pairs, "structural": sso_pairs}
WORDS = ("wwm", "span")  # objectives that need word boundaries
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def read_documents(files: list) -> list:
    """Plain-text files -> documents (blank-line-separated blocks) of sentences (lines, or
    split after . ! ? within a line)."""
    docs = []
    for file in files:
        try:
            text = Path(file).read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{file} is not UTF-8 text (byte {err.start})") from None
        for block in re.split(r"\n\s*\n", text):
            sentences = [s.strip() for line in block.splitlines() for s in SENTENCE_END.split(line) if s.strip()]
            if sentences:
                docs.append(sentences)
    if not docs:
        raise ValueError(f"no text in {', '.join(map(str, files))}")
    return docs


def tokenize_documents(tokenizer, docs: list) -> list:
    """Documents of sentences -> documents of sentence id lists (no special tokens)."""
    return [[ids for ids in (tokenizer.encode(s, add_special_tokens=False).ids for s in doc) if ids]
            for doc in docs]


def build_examples(objective: str, docs: list, tokenizer, max_len: int, seed: int) -> list:
    """The examples `objective` trains on, from tokenised documents."""
    cls, sep = tokenizer.special_id("cls"), tokenizer.special_id("sep")
    if objective in PAIRS:
        return PAIRS[objective](docs, cls, sep, max_len=max_len, seed=seed)
    if objective == "clm":
        return blocks(docs, max_len, eos=tokenizer.special_id("eos") or sep)
    examples = pack_sentences(docs, cls, sep, max_len=max_len, cross_documents=True)
    if objective in WORDS:
        for e in examples:
            e["word_starts"] = tokenizer.word_starts(e["input_ids"])
    return examples


def make_objective(name: str, model, tokenizer):
    """The objective `name` around `model`, with the tokenizer's special ids."""
    special = tuple(i for i in (tokenizer.special_id(r) for r in ("cls", "sep", "pad", "bos", "eos")) if i is not None)
    pad = tokenizer.special_id("pad") or 0
    if name == "clm":
        return CausalLM(model, pad_id=pad)
    mask = tokenizer.special_id("mask")
    if mask is None:
        raise ValueError(f"objective {name!r} needs a tokenizer with a mask token")
    common = dict(special_ids=special, pad_id=pad)
    if name in ("mlm", "wwm"):
        return MaskedLM(model, mask, whole_word=name == "wwm", **common)
    if name == "span":
        return SpanMLM(model, mask, **common)
    if name == "structural":
        return StructuralMLM(model, mask, **common)
    if name == "rtd":
        return ReplacedTokenDetection(model, mask, **common)
    return PairMLM(model, mask, task=name, **common)


def default_tokenizer(objective: str, docs: list, vocab_size: int):
    """A tokenizer trained on the corpus: WordPiece for encoders, byte-level BPE for decoders."""
    from lmforge.tokenizer import train_tokenizer

    text = [" ".join(doc) for doc in docs]
    if objective == "clm":
        return train_tokenizer(text, "bytelevel-bpe", vocab_size, family="gpt2")
    return train_tokenizer(text, "wordpiece", vocab_size, family="bert")


def run_tokenizer(out, objective: str, docs: list, vocab_size: int, wait_s: float = 600.0):
    """The run's tokenizer, trained once and kept in DIR/tokenizer.

    Training WordPiece/BPE/Unigram is not reproducible in `tokenizers` (hash-map order,
    huggingface/tokenizers#1794), so a resumed run, and every rank of a torchrun job, must
    read the one tokenizer rank 0 wrote rather than train its own."""
    from lmforge.tokenizer import load_tokenizer

    path = Path(out) / "tokenizer"
    if (path / "tokenizer.json").is_file():
        return load_tokenizer(path)
    if int(os.environ.get("RANK", "0")) != 0:
        deadline = time.monotonic() + wait_s
        while not (path / "tokenizer.json").is_file():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 wrote no tokenizer to {path} in {wait_s:.0f} s")
            time.sleep(0.2)
        return load_tokenizer(path)
    tokenizer = default_tokenizer(objective, docs, vocab_size)
    tmp = path.with_name(".tokenizer.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save(tmp)
    os.replace(tmp, path)  # other ranks see the whole directory or nothing
    return tokenizer


def pretrain(preset: str, objective: str, out, train: TrainConfig, files: list | None = None,
             tokenizer=None, n_docs: int = 2000, vocab_size: int = 1000, overrides: dict | None = None,
             resume: bool = False, log=print):
    """Pretrain `preset` with `objective` on `files` (default: the built-in corpus); returns the model."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    cfg = get_config(preset, **(overrides or {}))  # bad presets and fields fail before any work
    if (objective == "clm") != (cfg.architecture == "decoder"):
        raise ValueError(f"objective {objective!r} does not fit a {cfg.architecture} ({preset})")
    docs = read_documents(files) if files else list(documents(n_docs, seed=train.seed))
    tokenizer = tokenizer or run_tokenizer(out, objective, docs, vocab_size)
    cfg = cfg.replace(vocab_size=tokenizer.vocab_size)
    examples = build_examples(objective, tokenize_documents(tokenizer, docs), tokenizer,
                              min(cfg.max_seq_len, 128), train.seed)
    held_out = max(1, len(examples) // 20)
    task = make_objective(objective, from_config(cfg), tokenizer)
    trainer = Trainer(task, examples[held_out:], train, out, eval_data=examples[:held_out], log=log)
    untrained = probe_scores(task, tokenizer, train.seed) if not files and trainer.main else None
    model = trainer.fit(resume=resume)
    if trainer.main:
        tokenizer.save(Path(out) / "final")
        if untrained is not None:
            report_probes(untrained, probe_scores(task, tokenizer, train.seed), Path(out) / "probes.json", log)
    return model


def probe_scores(objective, tokenizer, seed: int) -> dict | None:
    """Cloze-probe accuracy of the objective's model through its LM head (None without one)."""
    from lmforge.analysis import score_probes
    from lmforge.data.probes import probes

    head = objective.heads().get("lm")
    if head is None or objective.model.config.architecture == "encoder-decoder":
        return None
    return score_probes(objective.model, tokenizer, probes(40, seed=seed), head=head)


def report_probes(untrained: dict, trained: dict, path: Path, log=print) -> None:
    """Write probes.json (accuracy per kind before and after pretraining) and log the overall line."""
    path.write_text(json.dumps({"untrained": untrained, "trained": trained}, indent=1) + "\n")
    log(f"cloze probes: {untrained['all']['accuracy']:.3f} untrained -> {trained['all']['accuracy']:.3f} "
        f"pretrained (chance {trained['all']['chance']:.3f}; per kind in {path})")
