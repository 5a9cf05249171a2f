"""The job behind `lmforge retrieve rag`: RAG (Lewis et al. 2020) trained end to end from a retriever
folder and a generator, then its exact match on the held-out questions (rag_train.py's objective,
rag_decode.py's decoding). The generator is a small BART built over the retriever tokenizer's
vocabulary (a preset of GENERATORS, drawn from the run's seed) or a saved encoder-decoder folder with
its own tokenizer; the passage index is embedded once by the retriever's passage encoder and fixed.
"""
from __future__ import annotations

import json

import torch

from lmforge.config.checks import within_context
from lmforge.config.options import OptionsError
from lmforge.retrieval.dpr import BiEncoder, passage_text
from lmforge.retrieval.job_options import RagOptions, check_rag_cost, job_config, options_of
from lmforge.retrieval.jobs import RUN_WRITES, named_path, question_sets
from lmforge.retrieval.rag_train import (QUESTION_PIECES, RAGObjective, exact_match_rate, passage_tokens,
                                         rag_examples)
from lmforge.train.checkpoint import training_folder
from lmforge.train.loop import Trainer
from lmforge.train.run_folder import check_start
from lmforge.utils.apart import refuse_writing_over
from lmforge.utils.atomic import atomic_write_text, replace_dir

# preset generators: a BART of these sizes over the retriever tokenizer's vocabulary (bart-small is
# bench/retrieval_qa.py's); max_seq_len grows to the run's max_len
GENERATORS = {"bart-small": {"n_layers": 3, "n_decoder_layers": 3, "d_model": 256, "n_heads": 4, "d_ff": 1024,
                             "max_seq_len": 128, "dropout": 0.1},
              "bart-tiny": {"n_layers": 1, "n_decoder_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64,
                            "max_seq_len": 64, "dropout": 0.1}}
QUESTION_TOKENS = QUESTION_PIECES + 3  # [CLS] [SEP] question [SEP]: a question alone


def generator_folder(generator: str | None) -> str | None:
    """The generator folder `generator` names (an input on disk, read as a model), None where it is a preset
    of GENERATORS or None."""
    return None if generator in GENERATORS else generator


def make_generator(generator: str, retriever: BiEncoder, max_len: int, seed: int) -> tuple:
    """(generator, its tokenizer): a GENERATORS preset over the retriever's tokenizer, drawn from `seed`
    (the global RNG left as it was), or the saved encoder-decoder folder `generator` and its tokenizer."""
    import lmforge
    from lmforge.io.resolve import find_model_dir

    if generator not in GENERATORS:
        path = find_model_dir(generator)
        return lmforge.load(path), lmforge.load_tokenizer(path)
    tok, sizes = retriever.tokenizer, GENERATORS[generator]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = lmforge.build("bart-base", **{**sizes, "max_seq_len": max(sizes["max_seq_len"], max_len)},
                              vocab_size=tok.vocab_size, decoder_start_token_id=tok.special_id("cls"),
                              pad_token_id=tok.special_id("pad"))
    return model, tok


def check_generator(model, options: RagOptions, passages: int) -> None:
    """An OptionsError naming the field where the generator cannot read max_len tokens or write
    max_new_tokens, or k is more passages than the index holds; a ValueError where a question alone is
    more than it reads."""
    within_context("max_len", options.max_len, model.config)
    if options.max_new_tokens >= model.config.max_seq_len:  # the decoder reads its start token too
        raise OptionsError(f"max_new_tokens={options.max_new_tokens}: the answer and its start token are "
                           f"more than the generator reads (max_seq_len={model.config.max_seq_len})",
                           "max_new_tokens")
    if options.k > passages:
        raise OptionsError(f"k={options.k}: more than the {passages} passages", "k")
    if model.config.max_seq_len < QUESTION_TOKENS:
        raise ValueError(f"the generator reads {model.config.max_seq_len} tokens; a question alone takes up "
                         f"to {QUESTION_TOKENS}")


def run_rag(retriever: str, out, cfg, questions: str | None = None, passages_source: str | None = None,
            generator: str = "bart-small", options: RagOptions | None = None, resume: bool = False,
            log=print) -> dict:
    """Train RAG (options.kind) from the retriever folder `retriever` and `generator` on the training
    questions, the question encoder at options.question_lr_scale of cfg.lr; then exact match on the
    held-out ones, decoded as options say. The generator (with its LM head and tokenizer) is saved in
    out/final, the retriever in out/retriever (the trained question encoder, the passage encoder that
    embedded the index); the result in out/rag.json, returned."""
    cfg = job_config("run_rag", cfg)
    options = options_of(RagOptions, options)
    check_rag_cost(options, cfg.batch_size)
    out = training_folder(out)
    refuse_writing_over(out, ("retriever", retriever), ("generator", generator_folder(generator)),
                        ("questions", named_path(questions)),
                        ("passages_source", named_path(passages_source)), writes=RUN_WRITES, holds=True)
    check_start(out, resume)  # a run there not resumed, a mistyped --out to resume: before the work
    passages, sets = question_sets(questions, passages_source, cfg.seed, answered=True)
    # the question encoder trains; the passages keep the encoder that embedded the fixed index, so the
    # saved retriever (out/retriever) is two encoders, as DPR's separate() makes them
    encoder = BiEncoder.from_dir(retriever).separate()
    model, tok = make_generator(generator, encoder, options.max_len, cfg.seed)
    check_generator(model, options, len(passages))
    check_rag_cost(options, cfg.batch_size, model.config.vocab_size)  # the vocabulary known: answer scores
    vectors = encoder.encode([passage_text(p) for p in passages], passage=True)
    objective = RAGObjective(model, encoder, vectors, passage_tokens(encoder, passages, tok), options.k,
                             options.kind, options.max_len, tokenizer=tok, seed=cfg.seed)
    train_rag(objective, rag_examples(encoder, sets["train"], tok), cfg, out, options, resume, log)
    replace_dir(out / "retriever", lambda folder: (encoder.model.save(folder), encoder.save(folder)))
    decoding = {"num_beams": options.num_beams, "decoding": options.decoding,
                "max_new_tokens": options.max_new_tokens}
    result = {"retriever": str(retriever), "generator": str(generator), "kind": options.kind, "k": options.k,
              "closed_book": options.k == 0, **decoding, "passages": len(passages),
              "train": len(sets["train"]), "test": len(sets["test"]), "steps": cfg.steps, "seed": cfg.seed,
              "exact_match": round(exact_match_rate(objective, sets["test"], cfg.batch_size, **decoding), 4)}
    atomic_write_text(out / "rag.json", json.dumps(result, indent=2) + "\n")
    return result


def train_rag(objective: RAGObjective, examples: list, cfg, out, options: RagOptions, resume: bool,
              log=print) -> None:
    """The shared Trainer over `objective`, the question encoder at options.question_lr_scale of cfg.lr; the
    generator (its LM head and tokenizer) saved in out/final. A resume with other RAG options is refused."""
    scale = options.question_lr_scale
    settings = {"kind": options.kind, "k": options.k, "max_len": options.max_len, "question_lr_scale": scale}

    def lr_scale(name: str, _) -> float:  # a DDP-wrapped objective's names start with module.
        return scale if name.removeprefix("module.").startswith("question_encoder.") else 1.0

    Trainer(objective, examples, cfg, out, log=log, settings=settings, lr_scale=lr_scale).fit(
        resume, final_files=(objective.tokenizer.save,))
