"""Pretraining recipes: corpus -> tokenizer -> examples -> objective -> Trainer.

`pretrain(objective, out, train, recipe, inputs)` is what `lmforge pretrain` runs (its options:
train.pretrain_options): the built-in corpus unless text files are given, a tokenizer trained on
it unless one is given, the examples the objective needs, and the one training loop. What differs
between objectives is data that each objective file registers (lmforge.objectives.registry): the
architectures it trains, the tokenizer family it wants, the format of its examples and how it is
built; this recipe reads those facts and never tests an objective's name. The tokenizer is saved
next to the model (DIR/final) so the result is a complete, loadable model directory.

Continued pretraining (SciBERT, Legal-BERT; Gururangan et al. 2020, "Don't stop pretraining")
starts from a checkpoint instead of a preset (PretrainInputs' `model=`): its weights, its own
tokenizer, and an LM head initialised where it has none; `add_tokens` first adds domain words to
the vocabulary.

The initial weights (the model, the heads, an objective's own modules such as ELECTRA's
generator) are drawn from the run's seed (`seeded_init`), so the same seed gives the same
model in any process, whatever the caller's RNG holds.
"""
from __future__ import annotations

import dataclasses
import json
import os
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from tokenizers import AddedToken

from lmforge import objectives
from lmforge.config.options import OptionsError, instance_of
from lmforge.data.corpus import CorpusReader
from lmforge.data.gpt_format import grow_vocabulary
from lmforge.data.read_options import ReadOptions
from lmforge.data.shard_oov import encode_documents, sentence_parts
from lmforge.data.stream import build_examples, open_shards, shard_examples
from lmforge.data.synthetic import documents
from lmforge.io import find_model_dir, load, model_dir
from lmforge.io.resolve import checked_tokenizer
from lmforge.model import from_config
from lmforge.objectives import ObjectiveSpec
from lmforge.objectives.distilbert import (check_copyable, check_teacher_vocabulary, refuse_teacher,
                                           teacher_config)
from lmforge.presets import get_config
from lmforge.tokenizer import load_tokenizer
from lmforge.train import TrainConfig, Trainer
from lmforge.train.config import check_ranks
from lmforge.train.data import derive_seed
from lmforge.train.distributed import several_ranks
from lmforge.train.pretrain_options import (MAX_ADDED_WORDS, PretrainInputs, RecipeOptions, check_read,
                                            check_sources, recipe_and_inputs)
from lmforge.train.run_folder import run_folder
from lmforge.train.tokenizer_run import already_kept, first_rank, pending_tokenizer
from lmforge.utils.atomic import atomic_write_text

# derive_seed streams of a run's seed: data order (seed, epoch), corruption (seed, pass, index, 1),
# evaluation (seed, i, 2), dropout (seed, step, rank, 3), fine-tuning's head (seed, 4) and preset
# (seed, 5). The initial weights take (seed, INIT_STREAM, 0, 0, 0): five parts, a length no other
# stream has, so their seed is never one of those (as two parts it would be epoch 6's data order).
INIT_STREAM = 6


def init_seed(seed: int) -> int:
    """The seed of a run's initial weights (model, heads, an objective's own modules)."""
    return derive_seed(seed, INIT_STREAM, 0, 0, 0)


@contextmanager
def seeded_init(seed: int):
    """Draw everything built inside from init_seed(seed), leaving the caller's RNG as it was."""
    with torch.random.fork_rng(devices=[]):  # models are built on the CPU
        torch.manual_seed(init_seed(seed))
        yield


def read_documents(files: list, options: ReadOptions | None = None) -> list:
    """Text, JSONL or gzip files -> documents (blank-line-separated blocks, JSONL records) of
    sentences, streamed and segmented by lmforge.data.corpus as `options` say (bad text: warnings)."""
    reader = CorpusReader(files, options)
    docs = list(reader)
    if not docs:
        raise ValueError(f"no text in {', '.join(map(str, files))}"
                         + "".join(f"; {p}" for p in reader.problems))
    return docs


def tokenize_documents(tokenizer, docs: list, spelled: bool = False) -> list:
    """Documents of sentences -> documents of sentence id lists (no special tokens); spelled (a word
    tokenizer's biLM): (ids, {position: spelling} of its <UNK> words) per sentence, as the character CNN
    reads every word's own characters (tokenizer/chars.py spelled_ids)."""
    # batched, as corpus shard tokenises its shards (data/shard_oov.py): the same ids, empty sentences dropped
    encoded = encode_documents(tokenizer.backend, docs, tokenizer.special_id("unk") if spelled else None)
    return [[s for s in doc if sentence_parts(s)[0]] for doc in encoded]


def special_token_ids(tokenizer, architecture: str) -> dict:
    """Config special ids from the tokenizer; an encoder-decoder's decoder starts with </s> where
    the text is <s> ... </s> (BART), else with the pad token (T5)."""
    pad, bos, eos = (tokenizer.special_id(r) for r in ("pad", "bos", "eos"))
    ids = dict(pad_token_id=pad, bos_token_id=bos, eos_token_id=eos)
    if architecture == "encoder-decoder":
        bart = bos is not None and bos != eos
        ids["decoder_start_token_id"] = eos if bart or pad is None else pad
    return ids


def read_words(path) -> list:
    """The domain words of an add_tokens file: one a line; blank lines and repeats skipped; at most
    MAX_ADDED_WORDS (each is a new embedding row)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read the add_tokens file {path}: {err}") from None
    words: dict = {}  # a dict keeps the file's order and drops repeats in one pass
    for n, line in enumerate(lines, 1):
        word = line.strip()
        if len(word.split()) > 1:
            raise ValueError(f"{path} line {n}: {word!r} is not one word (the file holds one word a line)")
        if word:
            words[word] = None
        if len(words) > MAX_ADDED_WORDS:
            raise ValueError(f"{path}: more than {MAX_ADDED_WORDS} words to add (add_tokens)")
    return list(words)


@torch.no_grad()
def add_words(model, tokenizer, words: list) -> list:
    """Add `words` to the tokenizer (each becomes one token) and grow the model's token table (and an
    LM head's output rows and bias) to match; each new row is the mean of the rows of the sub-words
    the old tokenizer split the word into, so a new token starts where its pieces were. Returns the
    words added: not those already one token."""
    norm = tokenizer.backend.normalizer  # an added token is matched in normalised text (lower case)
    pieces: dict = {}
    for word in words:
        ids = tokenizer.encode(word, add_special_tokens=False).ids
        key = norm.normalize_str(word) if norm is not None else word
        if ids and (len(ids) > 1 or ids[0] == tokenizer.unk_id) and key not in pieces:
            pieces[key] = ids
    # single_word: a domain word inside a longer word is not cut out of it
    tokenizer.backend.add_tokens([AddedToken(w, single_word=True, normalized=True) for w in pieces])
    if tokenizer.vocab_size > model.config.vocab_size:
        grow_vocabulary(model, tokenizer.vocab_size)
    lm = [h for h in model.heads.values() if h.spec.get("kind") == "lm"]
    for word, ids in pieces.items():
        row = tokenizer.token_to_id(word)
        model.tokens.weight[row] = model.tokens.weight[ids].mean(0)
        for head in lm:
            if head.decoder is not None:  # an untied output projection has rows of its own
                head.decoder.weight[row] = head.decoder.weight[ids].mean(0)
            if head.bias is not None:
                head.bias[row] = head.bias[ids].mean()
    return list(pieces)


def checkpoint_start(name, tokenizer=None, overrides: dict | None = None) -> tuple | None:
    """(model, tokenizer) that continued pretraining starts from: an lmforge or Hugging Face directory,
    or an installed model (io.find_model_dir), with its own tokenizer unless one is given; None: no name,
    a run from a preset or a teacher."""
    if name is None:
        return None
    if overrides:
        raise ValueError(f"model config fields ({', '.join(sorted(overrides))}) apply to a preset; a "
                         f"checkpoint is pretrained further as it is")
    path = find_model_dir(name)
    model, tokenizer = load(path), tokenizer or load_tokenizer(path)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but the model {path} only "
                         f"{model.config.vocab_size} embeddings")
    return model, tokenizer


def _preset_config(preset, overrides: dict | None):
    if preset is None:
        raise ValueError("give a preset, a checkpoint to continue (model=, --model DIR) or a teacher "
                         "(teacher=, --teacher DIR)")
    if model_dir(preset) is not None:  # a trained model is not an architecture to start afresh
        raise ValueError(f"{preset} is a model directory, not a preset: continue pretraining it with "
                         f"model='{preset}' (--model {preset})")
    return get_config(preset, **(overrides or {}))


def _checked_config(spec: ObjectiveSpec, preset, overrides: dict | None, teacher, start):
    """The model config `spec` will train, checked before any work: a preset's, a checkpoint's
    (`start`), or a distilled student's (the teacher's, whose every other layer the objective keeps)."""
    if start is not None:
        cfg = start[0].config
    else:
        cfg = teacher.config if teacher is not None else _preset_config(preset, overrides)
    spec.check(cfg, preset or "the checkpoint")
    return cfg


def _objective(spec: ObjectiveSpec, cfg, tokenizer, teacher, start, words: list, log):
    """The objective around the model it trains; run inside seeded_init, so all it draws is seeded."""
    if teacher is not None:  # a teacher objective grows its student from the teacher
        return spec.make(teacher, tokenizer)
    if start is None:
        return spec.make(from_config(cfg), tokenizer)
    model = start[0]
    if words:
        added = add_words(model, tokenizer, words)
        log(f"added {len(added)} of {len(words)} words to the vocabulary ({tokenizer.vocab_size} ids); "
            f"the rest were one token already")
    return spec.make(model, tokenizer)  # a missing LM head is built here, from the run's seed


def _settings(recipe: RecipeOptions, max_len: int, inputs: PretrainInputs) -> dict:
    """The recipe options a checkpoint records beside TrainConfig, for a reader to rerun the run (max_len as
    used; n_docs where the built-in corpus is read, else how the data files are read); a resume that changes
    them is refused."""
    read = {"read": (inputs.read or ReadOptions()).to_dict()} if inputs.data else {"n_docs": recipe.n_docs}
    return {"objective_options": recipe.objective_options or {}, "max_len": max_len, **read}


def _max_len(cfg, max_len: int | None) -> int:
    if max_len is None:
        return min(cfg.max_seq_len, 128)
    if not isinstance(max_len, int) or not 1 < max_len <= cfg.max_seq_len:
        raise ValueError(f"max_len must be an integer in [2, {cfg.max_seq_len}] (the model's max_seq_len), "
                         f"got {max_len!r}")
    return max_len


def _tokenizer(spec: ObjectiveSpec, out, tokenizer, start, shards, docs, vocab_size: int) -> tuple:
    """(the run's tokenizer, keep): a checkpoint's own, the one given, the shards', or one trained here,
    which keep() writes to DIR/tokenizer (tokenizer_run.pending_tokenizer; the others, and one a torchrun
    job's rank has written at once: a no-op)."""
    if start is not None:
        if shards and shards.tokenizer().backend.get_vocab() != start[1].backend.get_vocab():
            raise ValueError("the shards were tokenized with another tokenizer than the checkpoint's: "
                             "shard the text with the checkpoint's tokenizer, or give text files")
        return start[1], already_kept
    if tokenizer is not None or shards:
        return tokenizer or shards.tokenizer(), already_kept
    trained, keep = pending_tokenizer(out, spec.tokenizer, docs, vocab_size)
    if several_ranks():  # the other ranks wait for it before building their own examples: written now
        keep()
        return trained, already_kept
    return trained, keep


def teacher_model(spec: ObjectiveSpec, inputs: PretrainInputs) -> tuple:
    """(teacher, tokenizer): the teacher given (a model), or read from its folder or installed name with its
    own tokenizer unless one is given (as --teacher reads it: a student reads with its teacher's tokenizer);
    called once every other check of the request has passed, and the run's sources checked first
    (pretrain_options.check_sources), so a refused run reads no teacher's weights; a tokenizer of another
    vocabulary than the teacher's (given, the folder's own, or a model's shards') is refused here, before the
    corpus is read (check_teacher_vocabulary)."""
    check_sources(spec, inputs)
    teacher, tokenizer = inputs.teacher, checked_tokenizer(inputs.tokenizer)  # a folder's name: read
    field = "teacher" if tokenizer is None else "tokenizer"  # whose vocabulary a mismatch is said of
    if isinstance(teacher, (str, os.PathLike)):
        path = find_model_dir(teacher)
        # refused by its config.json alone, before its weights: the objective's architectures, and the
        # blocks every teacher objective's student copies (student_from_teacher's rule)
        refuse_teacher(f"teacher {teacher}", teacher_config(path), partial(spec.check, preset="the teacher"),
                       check_copyable)
        teacher, tokenizer = load(path), tokenizer or load_tokenizer(path)
    if teacher is not None:
        check_teacher_vocabulary(teacher, tokenizer, field)  # before the corpus is read
        if tokenizer is None and (shards := open_shards(inputs.data)):  # a model given alone: the shards'
            check_teacher_vocabulary(teacher, shards.tokenizer(), "data")
    return teacher, tokenizer


def _trainer(keep, make):
    """make(), the run's Trainer, then keep() writing the tokenizer trained here: after the examples and the
    Trainer's own refusals (device, epochs: they write nothing), so a refused run leaves no OUT/tokenizer
    nor replaces a stale one there (under torchrun _tokenizer has written it already)."""
    trainer = make()
    keep()
    return trainer


def rank_zero(log):
    """`log` on the first process, nothing on the others: each rank reads the corpus and builds the model,
    and one line of each is enough."""
    return log if first_rank() else (lambda *args, **kwargs: None)


def _examples(spec: ObjectiveSpec, shards, docs, tokenizer, max_len: int, seed: int, log=print) -> tuple:
    """(training examples, held-out examples), said in a line: what the run read and made of it; a text
    too short for one training example besides the held-out one is a ValueError saying so."""
    if shards:  # split by document; packed examples are built on access
        train, held = shard_examples(spec.examples, shards, tokenizer, max_len, seed, options=spec.options)
        log(f"read {len(shards):,} documents, {shards.n_tokens:,} tokens (shards): {len(train):,} training "
            f"and {len(held):,} held-out examples of up to {max_len} tokens")
        return train, held
    ids = tokenize_documents(tokenizer, docs, spelled=spec.tokenizer == "words")
    examples = build_examples(spec.examples, ids, tokenizer, max_len, seed, spec.options)
    held_out = max(1, len(examples) // 20)
    repeats = len(docs) - len({hash(tuple(d)) for d in docs})  # kept (a corpus may weight by them), said
    tokens = sum(len(sentence_parts(s)[0]) for d in ids for s in d)  # (ids, spellings) too
    read = (f"{len(docs):,} documents{f' ({repeats:,} repeats)' if repeats else ''}, "
            f"{sum(map(len, docs)):,} sentences, {tokens:,} tokens")
    if len(examples) <= held_out:  # a pair is cut from one document's 2+ sentences
        alone = spec.examples.kind == "pairs" and all(len(d) < 2 for d in docs)  # else max_len cuts more
        fix = "in documents of 2+ sentences" if alone else "or a smaller max_len"
        raise ValueError(f"the text ({read}) makes {len(examples)} example(s) of up to {max_len} tokens, "
                         f"held out for validation, and none to train on: give more text, {fix}")
    log(f"read {read}: {len(examples) - held_out:,} training and {held_out:,} held-out examples of up to "
        f"{max_len} tokens")
    return examples[held_out:], examples[:held_out]


def sized_to(cfg, tokenizer, asked, log):
    """cfg with the tokenizer's vocabulary (a different vocab_size override is said to be replaced)
    and, for generators, its special token ids."""
    if asked is not None and asked != tokenizer.vocab_size:  # the embeddings follow the tokenizer
        log(f"vocab_size={asked}: the model takes the tokenizer's {tokenizer.vocab_size} ids instead")
    cfg = cfg.replace(vocab_size=tokenizer.vocab_size)
    if cfg.architecture != "encoder":  # generation reads eos, pad and the decoder's start from the config
        cfg = cfg.replace(**special_token_ids(tokenizer, cfg.architecture))
    return cfg


def _corpus(inputs: PretrainInputs, recipe: RecipeOptions, start, seed: int) -> tuple:
    """(shards or None, documents or None, the domain words to add): what the run reads, checked
    against what it starts from."""
    words = read_words(recipe.add_tokens) if recipe.add_tokens else []
    if words and start is None:
        raise ValueError("add_tokens grows a checkpoint's vocabulary: give the checkpoint (model=, --model "
                         "DIR)")
    shards = open_shards(inputs.data)  # a directory of `lmforge corpus shard`: streamed, never loaded
    if words and shards:
        raise ValueError("add_tokens needs text files: shards are tokenized already, without the new words")
    if shards and inputs.read is not None:
        raise OptionsError(f"read: applies to text files; the shards in {inputs.data[0]} were read as their "
                           "manifest.json records", "read")
    if shards:
        return shards, None, words
    docs = read_documents(inputs.data, inputs.read) if inputs.data else list(documents(recipe.n_docs, seed))
    return None, docs, words


def pretrain(objective: str, out, train: TrainConfig, recipe: RecipeOptions | None = None,
             inputs: PretrainInputs | None = None, **fields):
    """Pretrain with `objective` (a registered name or alias) into `out`; returns the model. `inputs`
    (PretrainInputs): what the run starts from and reads: preset=, or model=DIR to continue a checkpoint
    (its tokenizer, an LM head added where missing), or teacher= (distillation); data= files (default:
    the built-in corpus), tokenizer=, overrides=, resume=, log=, evaluator=. `recipe` (RecipeOptions):
    add_tokens=FILE (domain words added first: add_words), max_len=, duplication=d (static masking: each
    example's corruption fixed in d copies, BERT's duplication factor), n_docs=. Any of their fields may
    be given as a keyword instead; an unknown or out-of-range one is an OptionsError naming it."""
    recipe, inputs = recipe_and_inputs(recipe, inputs, fields)
    check_ranks(instance_of(train, TrainConfig, "train", False))  # under torchrun: parallel=none, or no GPU
    # a link as it or its checkpoints/, a run there not resumed (or none to resume): refused before the
    # model and the corpus are read and a tokenizer trained
    out = run_folder(out, inputs.resume)
    spec, log = objectives.get(objective), rank_zero(inputs.log)
    check_read(spec, recipe, inputs)
    teacher, given = teacher_model(spec, inputs)  # given: the tokenizer, if any
    if recipe.objective_options:  # built with them, and its examples cut by them (T5's noise density)
        spec = dataclasses.replace(spec, options={**spec.options, **recipe.objective_options})
    start = checkpoint_start(inputs.model, given, inputs.overrides)  # None: none continued
    cfg = _checked_config(spec, inputs.preset, inputs.overrides, teacher, start)
    settings = _settings(recipe, _max_len(cfg, recipe.max_len), inputs)  # sized_to keeps max_seq_len
    shards, docs, words = _corpus(inputs, recipe, start, train.seed)
    tokenizer, keep = _tokenizer(spec, out, given, start, shards, docs, inputs.vocab_size())
    if start is None and teacher is None:
        cfg = sized_to(cfg, tokenizer, (inputs.overrides or {}).get("vocab_size"), log)
    with seeded_init(train.seed):
        task = _objective(spec, cfg, tokenizer, teacher, start, words, log)
    examples, held = _examples(spec, shards, docs, tokenizer, settings["max_len"], train.seed, log)
    trainer = _trainer(keep, partial(Trainer, task, examples, train, out, eval_data=held, log=log,
                                     duplication=recipe.duplication, evaluator=inputs.evaluator,
                                     settings=settings))
    untrained = probe_scores(task, tokenizer, train.seed) if not inputs.data and trainer.main else None
    result = trainer.fit(resume=inputs.resume, final_files=(tokenizer.save,))
    if trainer.main:
        if untrained:  # None: no LM head; {}: every probe longer than the model's positions
            report_probes(untrained, probe_scores(task, tokenizer, train.seed), out / "probes.json", log)
    return result


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

    atomic_write_text(path, json.dumps({"untrained": untrained, "trained": trained}, indent=1) + "\n")
    log(f"cloze probes, untrained->pretrained [chance] (per kind in {path}):")
    for line in compare(untrained, trained):
        log("  " + line)
