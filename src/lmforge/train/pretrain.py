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
import shutil
import time
from pathlib import Path

from lmforge.data.corpus import CorpusReader
from lmforge.data.examples import blocks, nsp_pairs, pack_sentences, sop_pairs, sso_pairs
from lmforge.data.stream import open_shards, shard_examples
from lmforge.data.synthetic import documents
from lmforge.model import from_config
from lmforge.objectives import (
    CausalLM,
    Denoising,
    MaskedLM,
    PairMLM,
    ReplacedTokenDetection,
    SpanCorruption,
    SpanMLM,
    StructuralMLM,
    prefix_lm,
)
from lmforge.objectives.distillation import Distillation, student_from_teacher
from lmforge.objectives.plm import PermutationLM
from lmforge.objectives.span_corruption import sentinel_ids
from lmforge.presets import get_config
from lmforge.train import TrainConfig, Trainer

OBJECTIVES = ("mlm", "wwm", "nsp", "sop", "span", "structural", "rtd", "clm")
OBJECTIVES += ("prefix-lm", "span-corruption", "denoising")
OBJECTIVES += ("plm", "distillation")
# the architectures each objective trains (the others: encoders)
ARCHITECTURES = {"clm": ("decoder",), "prefix-lm": ("decoder", "encoder-decoder"),
                 "span-corruption": ("encoder-decoder",), "denoising": ("encoder-decoder",)}
PAIRS = {"nsp": nsp_pairs, "sop": sop_pairs, "structural": sso_pairs}
WORDS = ("wwm", "span")  # objectives that need word boundaries


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


def build_examples(objective: str, docs: list, tokenizer, max_len: int, seed: int) -> list:
    """The examples `objective` trains on, from tokenised documents."""
    cls, sep = tokenizer.special_id("cls"), tokenizer.special_id("sep")
    if objective in PAIRS:
        return PAIRS[objective](docs, cls, sep, max_len=max_len, seed=seed)
    if objective in ("clm", "prefix-lm"):
        return blocks(docs, max_len, eos=tokenizer.special_id("eos") or sep)
    if objective == "span-corruption":  # raw tokens: the corrupted input plus </s> fits in max_len
        return blocks(docs, max_len - 1, eos=tokenizer.special_id("eos"))
    if objective == "denoising":  # BART: <s> sentences of one document </s>
        return pack_sentences(docs, tokenizer.special_id("bos"), tokenizer.special_id("eos"), max_len=max_len,
                              cross_documents=False)
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
    if name in ARCHITECTURES:
        return generative_objective(name, model, tokenizer)
    if name == "plm":  # XLNet: each example's first half is the memory segment of its second (sec. 2.5)
        return PermutationLM(model, special_ids=special, pad_id=pad, mem_len=model.config.max_seq_len // 2)
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


def generative_objective(name: str, model, tokenizer):
    """Prefix LM, T5 span corruption or BART denoising around `model`, with the tokenizer's ids."""
    pad, eos = tokenizer.special_id("pad") or 0, tokenizer.special_id("eos")  # the start: model.config
    if name == "prefix-lm":
        return prefix_lm(model, pad, eos)
    if name == "span-corruption":
        return SpanCorruption(model, sentinel_ids(tokenizer), eos, pad_id=pad)
    if tokenizer.special_id("mask") is None:
        raise ValueError(f"objective {name!r} needs a tokenizer with a mask token")
    # sentence permutation splits after each "." (what the corpus reader splits on, mostly)
    return Denoising(model, tokenizer.special_id("mask"), sentence_end=tokenizer.token_to_id("."),
                     bos_id=tokenizer.special_id("bos"), eos_id=eos, pad_id=pad)


def special_token_ids(tokenizer, architecture: str) -> dict:
    """Config special ids from the tokenizer; an encoder-decoder's decoder starts with </s> where
    the text is <s> ... </s> (BART), else with the pad token (T5)."""
    pad, bos, eos = (tokenizer.special_id(r) for r in ("pad", "bos", "eos"))
    ids = dict(pad_token_id=pad, bos_token_id=bos, eos_token_id=eos)
    if architecture == "encoder-decoder":
        bart = bos is not None and bos != eos
        ids["decoder_start_token_id"] = eos if bart or pad is None else pad
    return ids


def default_tokenizer(objective: str, docs: list, vocab_size: int):
    """A tokenizer trained on the corpus: WordPiece for encoders, byte-level BPE for decoders and
    BART, a T5 unigram with sentinels for span corruption."""
    from lmforge.tokenizer import train_tokenizer

    text = [" ".join(doc) for doc in docs]
    if objective in ("clm", "prefix-lm"):
        return train_tokenizer(text, "bytelevel-bpe", vocab_size, family="gpt2")
    if objective == "span-corruption":  # T5: SentencePiece-style unigram, <extra_id_N> sentinels
        return train_tokenizer(text, "unigram", vocab_size, family="t5")
    if objective == "denoising":  # BART: GPT-2's byte-level BPE, RoBERTa's <s> <pad> </s> <unk> <mask>
        return train_tokenizer(text, "bytelevel-bpe", vocab_size, family="roberta")
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


def _checked_config(preset, objective: str, overrides: dict | None, teacher):
    """The model config `objective` will train, checked before any work (a distilled student's: the
    teacher's, n_layers halved by student_from_teacher)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if (objective == "distillation") != (teacher is not None):
        raise ValueError("objective 'distillation' needs a teacher model, and only it takes one (--teacher DIR)")
    cfg = teacher.config if teacher is not None else get_config(preset, **(overrides or {}))
    if cfg.architecture not in ARCHITECTURES.get(objective, ("encoder",)):
        raise ValueError(f"objective {objective!r} does not fit a {cfg.architecture} ({preset})")
    if objective == "plm" and cfg.position != "xl-relative":  # two-stream attention is XLNet's
        raise ValueError(f"objective {objective!r} does not fit position={cfg.position!r} ({preset})")
    return cfg


def distillation(teacher, tokenizer) -> Distillation:
    """DistilBERT (Sanh et al. 2019): a student of every other teacher layer, trained against the teacher."""
    if tokenizer.vocab_size != teacher.config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids, the teacher's vocabulary "
                         f"{teacher.config.vocab_size}: distil with the teacher's own tokenizer")
    special = tuple(i for i in (tokenizer.special_id(r) for r in ("cls", "sep", "pad")) if i is not None)
    return Distillation(student_from_teacher(teacher), teacher, tokenizer.special_id("mask"),
                        special_ids=special, pad_id=tokenizer.special_id("pad") or 0)


def pretrain(preset: str, objective: str, out, train: TrainConfig, files: list | None = None,
             tokenizer=None, n_docs: int = 2000, vocab_size: int = 1000, overrides: dict | None = None,
             resume: bool = False, log=print, duplication: int = 0, teacher=None):
    """Pretrain `preset` with `objective` on `files` (default: the built-in corpus); returns the model.
    duplication=d: static masking, each example's corruption fixed in d copies (BERT's duplication
    factor) instead of drawn anew each epoch; teacher: the model objective 'distillation' distils."""
    cfg = _checked_config(preset, objective, overrides, teacher)
    shards = open_shards(files)  # a directory of `lmforge corpus shard`: streamed, never loaded
    docs = None if shards else read_documents(files) if files else list(documents(n_docs, seed=train.seed))
    tokenizer = tokenizer or (shards.tokenizer() if shards else run_tokenizer(out, objective, docs, vocab_size))
    cfg = cfg if teacher is not None else cfg.replace(vocab_size=tokenizer.vocab_size)
    if objective in ARCHITECTURES:  # generation reads eos, pad and the decoder's start from the config
        cfg = cfg.replace(**special_token_ids(tokenizer, cfg.architecture))
    max_len = min(cfg.max_seq_len, 128)
    if shards:  # split by document; packed examples are built on access
        examples, held = shard_examples(objective, shards, tokenizer, max_len, train.seed, build_examples)
    else:
        examples = build_examples(objective, tokenize_documents(tokenizer, docs), tokenizer, max_len, train.seed)
        held_out = max(1, len(examples) // 20)
        examples, held = examples[held_out:], examples[:held_out]
    task = distillation(teacher, tokenizer) if teacher is not None else make_objective(objective, from_config(cfg),
                                                                                       tokenizer)
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
