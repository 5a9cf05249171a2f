"""Pretraining recipes: corpus -> tokenizer -> examples -> objective -> Trainer.

`pretrain(...)` is what `lmforge pretrain` runs: the built-in corpus unless text files
are given, a tokenizer trained on it unless one is given, the examples the objective
needs, and the one training loop. What differs between objectives is data that each
objective file registers (lmforge.objectives.registry): the architectures it trains, the
tokenizer family it wants, the format of its examples and how it is built; this recipe
reads those facts and never tests an objective's name. The tokenizer is saved next to the
model (DIR/final) so the result is a complete, loadable model directory.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from lmforge import objectives
from lmforge.data.corpus import CorpusReader
from lmforge.data.stream import build_examples, open_shards, shard_examples
from lmforge.data.synthetic import documents
from lmforge.model import from_config
from lmforge.objectives import ObjectiveSpec
from lmforge.objectives.registry import TOKENIZER_KINDS
from lmforge.presets import get_config
from lmforge.train import TrainConfig, Trainer


def read_documents(files: list) -> list:
    """Text, JSONL or gzip files -> documents (blank-line-separated blocks, JSONL records) of
    sentences, streamed and segmented by lmforge.data.corpus (bad text: warnings)."""
    reader = CorpusReader(files)
    docs = list(reader)
    if not docs:
        raise ValueError(f"no text in {', '.join(map(str, files))}" + "".join(f"; {p}" for p in reader.problems))
    return docs


def tokenize_documents(tokenizer, docs: list) -> list:
    """Documents of sentences -> documents of sentence id lists (no special tokens)."""
    return [[ids for ids in (tokenizer.encode(s, add_special_tokens=False).ids for s in doc) if ids]
            for doc in docs]


def special_token_ids(tokenizer, architecture: str) -> dict:
    """Config special ids from the tokenizer; an encoder-decoder's decoder starts with </s> where
    the text is <s> ... </s> (BART), else with the pad token (T5)."""
    pad, bos, eos = (tokenizer.special_id(r) for r in ("pad", "bos", "eos"))
    ids = dict(pad_token_id=pad, bos_token_id=bos, eos_token_id=eos)
    if architecture == "encoder-decoder":
        bart = bos is not None and bos != eos
        ids["decoder_start_token_id"] = eos if bart or pad is None else pad
    return ids


def default_tokenizer(family: str, docs: list, vocab_size: int):
    """A tokenizer of `family` (an objective's: bert, roberta, gpt2, t5) trained on the corpus, with the
    subword model of the family's original: WordPiece, byte-level BPE, or a T5 unigram with sentinels."""
    from lmforge.tokenizer import train_tokenizer

    text = [" ".join(doc) for doc in docs]
    return train_tokenizer(text, TOKENIZER_KINDS[family], vocab_size, family=family)


def run_tokenizer(out, family: str, docs: list, vocab_size: int, wait_s: float = 600.0):
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
    tokenizer = default_tokenizer(family, docs, vocab_size)
    tmp = path.with_name(".tokenizer.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save(tmp)
    os.replace(tmp, path)  # other ranks see the whole directory or nothing
    return tokenizer


def _checked_config(spec: ObjectiveSpec, preset, overrides: dict | None, teacher):
    """The model config `spec` will train, checked before any work (a distilled student's: the
    teacher's, whose every other layer the objective keeps)."""
    if spec.teacher and teacher is None:
        raise ValueError(f"objective {spec.name!r} needs a teacher model (--teacher DIR)")
    if teacher is not None and not spec.teacher:
        takers = ", ".join(s.name for s in objectives.specs() if s.teacher)
        raise ValueError(f"objective {spec.name!r} takes no teacher model (--teacher DIR is for {takers})")
    cfg = teacher.config if teacher is not None else get_config(preset, **(overrides or {}))
    spec.check(cfg, preset)
    return cfg


def pretrain(preset: str, objective: str, out, train: TrainConfig, files: list | None = None,
             tokenizer=None, n_docs: int = 2000, vocab_size: int = 1000, overrides: dict | None = None,
             resume: bool = False, log=print, duplication: int = 0, teacher=None):
    """Pretrain `preset` with `objective` (a registered name or alias) on `files` (default: the built-in
    corpus); returns the model. duplication=d: static masking, each example's corruption fixed in d
    copies (BERT's duplication factor) instead of drawn anew each epoch; teacher: the model a teacher
    objective (distillation) distils, whose config the student's is."""
    spec = objectives.get(objective)
    cfg = _checked_config(spec, preset, overrides, teacher)
    shards = open_shards(files)  # a directory of `lmforge corpus shard`: streamed, never loaded
    docs = None if shards else read_documents(files) if files else list(documents(n_docs, seed=train.seed))
    tokenizer = tokenizer or (shards.tokenizer() if shards else run_tokenizer(out, spec.tokenizer, docs, vocab_size))
    cfg = cfg if teacher is not None else cfg.replace(vocab_size=tokenizer.vocab_size)
    if cfg.architecture != "encoder":  # generation reads eos, pad and the decoder's start from the config
        cfg = cfg.replace(**special_token_ids(tokenizer, cfg.architecture))
    max_len = min(cfg.max_seq_len, 128)
    if shards:  # split by document; packed examples are built on access
        examples, held = shard_examples(spec.examples, shards, tokenizer, max_len, train.seed)
    else:
        examples = build_examples(spec.examples, tokenize_documents(tokenizer, docs), tokenizer, max_len, train.seed)
        held_out = max(1, len(examples) // 20)
        examples, held = examples[held_out:], examples[:held_out]
    # a teacher objective grows its student from the teacher; any other trains a fresh model of cfg
    task = spec.make(teacher if teacher is not None else from_config(cfg), tokenizer)
    trainer = Trainer(task, examples, train, out, eval_data=held, log=log, duplication=duplication)
    untrained = probe_scores(task, tokenizer, train.seed) if not files and trainer.main else None
    model = trainer.fit(resume=resume)
    if trainer.main:
        tokenizer.save(Path(out) / "final")
        if untrained:  # None: no LM head; {}: every probe longer than the model's positions
            report_probes(untrained, probe_scores(task, tokenizer, train.seed), Path(out) / "probes.json", log)
    return model


PROBES_PER_KIND = 100  # 8 kinds: 800 probes, so a per-kind accuracy is known to about +-0.05


def probe_scores(objective, tokenizer, seed: int) -> dict | None:
    """Cloze-probe scores of the objective's model through its LM head (None without one)."""
    from lmforge.analysis import score_probes
    from lmforge.data.probes import probes

    head = objective.heads().get("lm")
    if head is None or objective.model.config.architecture == "encoder-decoder":
        return None
    return score_probes(objective.model, tokenizer, probes(PROBES_PER_KIND, seed=seed), head=head)


def report_probes(untrained: dict, trained: dict, path: Path, log=print) -> None:
    """Write probes.json (every measure per kind and group, before and after pretraining) and log
    the overall and per-group lines."""
    from lmforge.analysis import compare

    path.write_text(json.dumps({"untrained": untrained, "trained": trained}, indent=1) + "\n")
    log(f"cloze probes, untrained->pretrained [chance] (per kind in {path}):")
    for line in compare(untrained, trained):
        log("  " + line)
