"""The jobs behind `lmforge index build` and `lmforge retrieve`: an index directory (passages, BM25,
optionally dense), queries against it (answered by a reader, if given), a DPR training run with its
recall table, and an extractive reader's training run with its exact match.

An index directory holds passages.jsonl, bm25/ (bm25s files) and, with a model, dense/ (see
index.py; its manifest names the model that embeds the queries), bound by index.json (index_dir.py):
every file is checked on read.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from lmforge.config.checks import within_context
from lmforge.config.options import (OptionsError, checked_argument, checked_as, checked_texts, named_keywords,
                                    refuse_changed)
from lmforge.fast.optimize import optimize
from lmforge.retrieval.bm25 import BM25Index, negatives_depth
from lmforge.retrieval.dictionary_qa import dictionary_questions
from lmforge.retrieval.dpr import BiEncoder, DPRObjective
from lmforge.retrieval.evaluate import (VECTOR_OPTIONS, bm25_rankings, compare, dense_rankings,
                                        encode_passages, recall_at_k, train_dpr, write_table)
from lmforge.retrieval.index import DenseIndex
from lmforge.retrieval.index_dir import finish_build, open_index, refuse_foreign_parts, start_build
from lmforge.retrieval.job_options import (MAX_CANDIDATES, MAX_HARD_NEGATIVES, MAX_QUERIES, MAX_QUERY_CHARS,
                                           MAX_READ, IctOptions, IndexOptions, QueryOptions, ReaderOptions,
                                           RealmOptions, job_config, options_of)
from lmforge.retrieval.passages import is_passages_file, load_passages, write_passages
from lmforge.retrieval.questions import builtin_questions, check_answers, check_positives, read_questions
from lmforge.retrieval.reader import ExtractiveReader, reader_exact_match, reader_examples
from lmforge.train.checkpoint import RUN_FILES, training_folder
from lmforge.train.config import TrainConfig
from lmforge.train.loop import Trainer
from lmforge.train.run_folder import check_start
from lmforge.utils.apart import refuse_writing_over
from lmforge.utils.atomic import atomic_write_text, refuse_link, replace_dir
from lmforge.utils.ranks import one_process


TRAINING_ONLY = {"temperature", "matryoshka_dims", "matryoshka_weights"}  # read by the loss alone


def build_index_dir(out, source: str | None, model: str | None = None, seed: int = 0,
                    index: IndexOptions | None = None, progress: bool = True, **options) -> dict:
    """Passages from `source` into out/passages.jsonl, out/bm25/, and with `model` out/dense/ (`options`:
    EncoderOptions fields); returns counts for the summary line."""
    one_process("build_index_dir")
    index, out = options_of(IndexOptions, index), refuse_link(out)
    seed = checked_as(TrainConfig, "seed", seed)  # the bound --seed has: True read as 1, -1 passed
    # every input judged whole (a model folder is read by its layout: a retriever's passage/), and never
    # held by out: a later run would read it back
    refuse_writing_over(out, ("source", named_path(source)), ("model", model), writes=INDEX_WRITES,
                        holds=True)
    if options and not model:
        raise OptionsError(f"encoder options {sorted(options)} need a model to embed with",
                           min(options))
    trained = sorted(set(options) & TRAINING_ONLY)  # the loss's: an index embeds, it never trains
    if trained:
        raise OptionsError(f"{trained[0]}: a setting of the training loss; an index build embeds and never "
                           "trains, so it would be ignored; drop it", trained[0])
    if not model:
        refuse_changed(index, ("batch_size",), "passages embedded at once, for a dense index; without a "
                       "model there is none to embed")
    if source not in (None, "builtin") and is_passages_file(source):
        refuse_changed(index, ("words",), f"{source} is a passages file: its passages are read as they are, "
                       "not cut into windows of words")
    encoder = _encoder(model, **options) if model else None  # a bad max_length refused before out is made
    passages = load_passages(source, seed, index.words)
    bm25 = BM25Index.build(passages, where=source or "builtin")  # passages with no words: refused before out
    refuse_foreign_parts(out)
    start_build(out)
    write_passages(passages, out / "passages.jsonl")
    bm25.save(out / "bm25")
    summary = {"passages": len(passages), "bm25": str(out / "bm25")}
    if model:
        name = str(Path(model).resolve()) if Path(model).is_dir() else str(model)
        dense = encode_passages(encoder, passages, out / "dense", index.batch_size, progress, model_name=name)
        summary.update(dense=str(out / "dense"), dim=dense.dim, cut=encoder.cut)  # passages past max_length
    # a dense/ left from an earlier build holds other passages' vectors: not listed, so never searched
    finish_build(out, len(passages), ("bm25", "dense") if model else ("bm25",))
    return summary


# what a run writes into out: every training run's files and these jobs' own
RUN_WRITES = (*RUN_FILES, "eval", "retriever", "index", "recall.json", "reader.json", "realm.json",
              "ict.json", "rag.json")
INDEX_WRITES = ("passages.jsonl", "bm25", "dense", "index.json")


def named_path(given):
    """`given`, or None where it names a built-in corpus or question set ("builtin", "gcide"), not a path:
    a folder of that name in the working folder is not what the run reads, so no input to write over."""
    return None if given in BUILTIN_NAMES else given


BUILTIN_NAMES = ("builtin", "gcide")


def _encoder(model: str, **options) -> BiEncoder:
    """BiEncoder.from_dir(model, **options); an OptionsError naming max_length where it is more tokens than
    the model reads (the encoder would cut every text to its positions, silently)."""
    encoder = BiEncoder.from_dir(model, **options)
    within_context("max_length", options.get("max_length"), encoder.model.config)
    return encoder


@named_keywords("query_index")
def query_index(path, queries: list, options: QueryOptions | None = None, model: str | None = None,
                reader: str | None = None, rerank: str | None = None) -> list:
    """[{"query", "results": [{"rank", "id", "title", "score", "text"}]}] for each query, and with a
    `reader` directory its "answer" ({"answer", "id", "score"}) read from those passages. With a `rerank`
    directory (a cross-encoder, lmforge finetune --task rerank) the retriever's top `candidates` (default
    k) are re-ordered by it and the best k kept: "score" is then the reranker's relevance, beside the
    retriever's "retriever_rank" and "retriever_score". `queries`: texts (a list, a generator, ...) or
    one text, read as lmforge.embed reads its texts (one text was searched a character at a time)."""
    options, path = options_of(QueryOptions, options), Path(path)
    queries, k = _checked_queries(queries), options.k
    if model is not None and options.method == "bm25":
        raise OptionsError(f"model={model}: the dense search's query encoder; method bm25 searches words, "
                           "not vectors", "model")
    if options.candidates is not None and rerank is None:
        raise OptionsError(f"candidates={options.candidates}: needs a reranker to re-order them",
                           "candidates")
    if rerank is not None and options.candidates is None and k > MAX_CANDIDATES:
        raise OptionsError(f"k={k}: a reranker re-orders at most {MAX_CANDIDATES} passages a query", "k")
    if reader is not None and k > MAX_READ:  # it reads the top k in one batch
        raise OptionsError(f"k={k}: a reader reads at most {MAX_READ} passages a query", "k")
    passages, parts = open_index(path)
    if not queries:  # nothing to search (the searches fail on an empty batch)
        return []
    positions, scores = _search(path, parts, queries, options.candidates or k, options, model)
    out = [{"query": q, "results": [{"rank": r + 1, "id": passages[int(i)].id,
                                     "title": passages[int(i)].title, "score": round(float(s), 4),
                                     "text": passages[int(i)].text}
                                    for r, (i, s) in enumerate(zip(row, srow))]}
           for q, row, srow in zip(queries, positions, scores)]
    if rerank:
        out = _reranked(out, passages, rerank, k)
        at = {p.id: i for i, p in enumerate(passages)}
        positions = [[at[res["id"]] for res in o["results"]] for o in out]
    if reader:
        read = ExtractiveReader.from_dir(reader, trained=True).read
        for result, row in zip(out, positions):
            result["answer"] = read(result["query"], [passages[int(i)] for i in row])
    return out


def _checked_queries(queries) -> list:
    """`queries` as a list of texts (read once: a generator searched, then zipped empty, gave []), at most
    MAX_QUERIES of at most MAX_QUERY_CHARS characters, none blank; an OptionsError naming queries else."""
    queries = checked_texts(queries, "queries")
    if len(queries) > MAX_QUERIES:
        raise OptionsError(f"{len(queries)} queries: at most {MAX_QUERIES} at once", "queries")
    for i, query in enumerate(queries):
        if len(query) > MAX_QUERY_CHARS:
            raise OptionsError(f"queries[{i}] has {len(query)} characters, more than {MAX_QUERY_CHARS}",
                               "queries")
        if not query.strip():  # it matched nothing: arbitrary passages scored 0 (rerank refuses it)
            raise OptionsError(f"queries[{i}] is blank: a query needs words to search for", "queries")
    return queries


def _search(path: Path, parts: set, queries: list, k: int, options: QueryOptions, model: str | None) -> tuple:
    """(positions, scores) of each query's top k passages by BM25 or the dense index (options.method)."""
    if options.method == "bm25":
        return BM25Index.load(path / "bm25").search(queries, k)
    if "dense" not in parts:
        raise OptionsError(f"{path}: no dense index: build it with an encoder (model=, --model), or query "
                           f"with method='bm25' (--method bm25)", "method")
    index = DenseIndex.load(path / "dense")
    name = model or index.manifest.get("model") or ""
    # queries embedded as the passages were (pooling, max_length given at build time, not the folder's own)
    built = index.manifest.get("options") if isinstance(index.manifest.get("options"), dict) else {}
    encoder = BiEncoder.from_dir(name, **{field: v for field, v in built.items() if field in VECTOR_OPTIONS})
    index.check_encoder(encoder.width, encoder.fingerprint(), name, encoder.tokenizer_fingerprint())
    scores, positions = index.search(encoder.encode(queries), k, backend=options.backend)
    return positions.numpy(), scores.numpy()


def _reranked(out: list, passages: list, rerank: str, k: int) -> list:
    """The results re-ordered by the reranker, the best k kept."""
    from lmforge.pipelines.rerank import Reranker
    from lmforge.retrieval.rerank import rerank_ids

    reranker, by_id = Reranker.load(rerank), {p.id: p for p in passages}
    for o in out:
        was = {res["id"]: res for res in o["results"]}
        ids, scores = rerank_ids(reranker, o["query"], list(was), by_id)
        o["results"] = [{**was[i], "rank": r + 1, "score": round(s, 4), "retriever_rank": was[i]["rank"],
                         "retriever_score": was[i]["score"]}
                        for r, (i, s) in enumerate(zip(ids[:k], scores[:k]))]
    return out


def question_sets(questions: str | None, passages_source: str | None, seed: int,
                  answered: bool = False) -> tuple:
    """(passages, {"train", "test"} records): built-in, the dictionary's ("gcide": see dictionary_qa),
    or a user's QA file split 90/10 (seeded); `answered`: each of its questions must have an answer."""
    if questions == "gcide":
        if passages_source:
            raise OptionsError("questions='gcide' (--questions gcide) brings its own passages (dictionary "
                               "entries): drop passages_source (--passages)", "passages_source")
        return dictionary_questions(seed=seed)
    if questions in (None, "builtin"):
        passages = load_passages(passages_source, seed)
        sets = builtin_questions(passages, seed)
        return passages, {"train": sets["train"], "test": sets["test"]}
    records, passages = read_questions(questions)
    if passages_source:
        passages = load_passages(passages_source, seed)
    check_positives(records, passages, questions)
    if answered:
        check_answers(records, questions)
    records = list(records)
    random.Random(seed).shuffle(records)
    cut = max(1, int(0.9 * len(records)))
    if cut >= len(records):
        raise ValueError(f"{questions}: {len(records)} question(s) are too few to hold some out for the test")
    return passages, {"train": records[:cut], "test": records[cut:]}


def run_train(model: str, out, cfg, questions: str | None = None, passages_source: str | None = None,
              n_hard: int = 1, resume: bool = False, log=print, separate: bool = False, **options) -> dict:
    """Train DPR from `model` on the training questions (with `separate` question and passage
    encoders), then recall@k on the held-out ones for BM25, the untrained and the trained encoder;
    written to out/recall.json and returned."""
    cfg = job_config("run_train", cfg)
    n_hard = checked_argument("n_hard", "int", {"low": 0, "high": MAX_HARD_NEGATIVES},
                              n_hard)  # --hard-negatives
    out = training_folder(out)
    refuse_writing_over(out, ("model", model), ("questions", named_path(questions)),
                        ("passages_source", named_path(passages_source)), writes=RUN_WRITES, holds=True)
    check_start(out, resume)  # a run there not resumed (or none to resume): before the model is read
    encoder = _encoder(model, **options)
    if "temperature" in options and not encoder.options.normalize:  # the loss scales cosines only
        raise OptionsError(f"temperature={options['temperature']}: it divides cosine scores; with normalize="
                           "false the loss reads raw inner products, unscaled", "temperature")
    passages, sets = question_sets(questions, passages_source, cfg.seed)
    trained = train_dpr(encoder.separate() if separate else encoder, sets["train"], passages, out, cfg,
                        n_hard, resume, log)
    table = {}

    def evaluate(folder: Path) -> None:  # out/eval made whole in a fresh folder: a link there is replaced
        table.update(compare(passages, sets["test"], {"untrained": BiEncoder.from_dir(model, **options),
                                                      "trained": trained}, folder))
        atomic_write_text(folder / "questions.json", json.dumps({"train": len(sets["train"]), "test": len(
            sets["test"]), "passages": len(passages), "seed": cfg.seed}))  # the seed drew the split

    replace_dir(out / "eval", evaluate)
    write_table(table, out / "recall.json")
    return table


def rankings(passages: list, records: list, out, retriever: str | None = None, k: int = 20) -> list:
    """Ranked passage ids of `records` from BM25, or from a trained DPR directory (its passages
    embedded under out/index)."""
    if retriever is None:
        return bm25_rankings(BM25Index.build(passages), passages, records, k)
    encoder = BiEncoder.from_dir(retriever)
    return dense_rankings(encoder, encode_passages(encoder, passages, Path(out) / "index"), records, k)


def run_reader(model: str, out, cfg, questions: str | None = None, passages_source: str | None = None,
               retriever: str | None = None, options: ReaderOptions | None = None, resume: bool = False,
               log=print) -> dict:
    """Train the extractive reader from `model` (its new heads drawn from cfg.seed; `resume` continues
    out/checkpoints) on the training questions (each with its positive and BM25 negatives), then exact
    match on the held-out ones read from their top-k passages (BM25's, or `retriever`'s); written to
    out/reader.json and returned."""
    cfg = job_config("run_reader", cfg)
    options = options_of(ReaderOptions, options)
    k, out = options.k, training_folder(out)
    refuse_writing_over(out, ("model", model), ("questions", named_path(questions)),
                        ("passages_source", named_path(passages_source)), ("retriever", retriever),
                        writes=RUN_WRITES, holds=True)
    check_start(out, resume)  # a run there not resumed, a mistyped --out to resume: before the work
    passages, sets = question_sets(questions, passages_source, cfg.seed, answered=True)
    reader = ExtractiveReader.from_dir(model, options.max_len, seed=cfg.seed)
    within_context("max_len", options.max_len, reader.model.config)
    train_ranked = rankings(passages, sets["train"], out, None, negatives_depth(options.negatives))
    examples = reader_examples(reader, sets["train"], passages, train_ranked, options.negatives)
    Trainer(reader, examples, cfg, out, log=log).fit(resume, final_files=(reader.tokenizer.save,))
    ranked = rankings(passages, sets["test"], out, retriever, k)
    result = {"retriever": retriever or "bm25", "k": k, "test": len(sets["test"]), "seed": cfg.seed,
              "reader_exact_match": round(reader_exact_match(reader, sets["test"], passages, ranked, k), 4),
              **{n: round(v, 4) for n, v in recall_at_k(ranked, sets["test"], (1, k)).items()}}
    atomic_write_text(out / "reader.json", json.dumps(result, indent=2) + "\n")
    return result


def split_by_title(passages: list, test_share: float, seed: int) -> tuple:
    """(train rows, test rows) of the passages, whole documents (titles) held out, seeded."""
    titles = sorted({p.title for p in passages})
    if len(titles) < 2:
        raise OptionsError(f"passages_source (--passages): {len(titles)} document title(s); holding whole "
                           "documents out needs two or more", "passages_source")
    random.Random(seed).shuffle(titles)
    held = set(titles[:max(1, round(test_share * len(titles)))])
    rows = range(len(passages))
    return [i for i in rows if passages[i].title not in held], [i for i in rows if passages[i].title in held]


def realm_examples(tokenizer, passages: list, seed: int, max_len: int = 192) -> dict:
    """{"train", "test"} salient-span examples, whole documents held out (split_by_title, 10 %); x takes
    at most half of max_len (and 64 tokens), so a retrieved document always has room beside it."""
    from lmforge.retrieval.salient import span_examples

    train_rows, test_rows = split_by_title(passages, 0.1, seed)
    examples = {name: span_examples(tokenizer, passages, rows, min(64, max_len // 2), seed=seed)
                for name, rows in (("train", train_rows), ("test", test_rows))}
    if not examples["train"] or not examples["test"]:
        raise ValueError("no salient spans (names or dates) in the passages to mask")
    return examples


def run_realm(model: str, out, cfg, passages_source: str | None = None, retriever: str | None = None,
              options: RealmOptions | None = None, resume: bool = False, log=print) -> dict:
    """REALM pretraining: salient-span MLM over the passages, the knowledge-augmented encoder from
    `model` and Embed_input / Embed_doc from `retriever` (default `model`), both encoders trained; held-out
    documents' spans scored before and after (realm.evaluate_realm), written to out/realm.json. The
    encoder (with its MLM head) is saved in out/final, the retriever in out/retriever."""
    from lmforge.io import load
    from lmforge.io.resolve import find_model_dir
    from lmforge.retrieval.realm import REALMObjective, evaluate_realm

    cfg = job_config("run_realm", cfg)
    options, out = options_of(RealmOptions, options), training_folder(out)
    refuse_writing_over(out, ("model", model), ("passages_source", named_path(passages_source)),
                        ("retriever", retriever), writes=RUN_WRITES, holds=True)
    check_start(out, resume)  # a run there not resumed (or none to resume): before any read
    passages = load_passages(passages_source, cfg.seed)
    encoder = BiEncoder.from_dir(retriever or model).separate()
    reader = load(find_model_dir(model))
    within_context("max_len", options.max_len, reader.config)
    if "lm" not in reader.heads:  # REALM trains it; its "before" scores read with an untrained head
        log(f"note: {model} has no MLM head: REALM starts one untrained (the 'before' scores read with it)")
    if reader.config.vocab_size != encoder.model.config.vocab_size:
        raise ValueError(f"the retriever's vocabulary ({encoder.model.config.vocab_size}) is not the model's "
                         f"({reader.config.vocab_size}): REALM reads both with one tokenizer")
    examples = realm_examples(encoder.tokenizer, passages, cfg.seed, options.max_len)
    objective = optimize(REALMObjective(optimize(reader), encoder, passages, options.k, options.refresh_every,
                                       options.max_len, options.null_document, seed=cfg.seed))
    before = evaluate_realm(objective, examples["test"], passages)
    trainer = Trainer(objective, examples["train"], cfg, out, log=log)
    trainer.fit(resume, final_files=(encoder.tokenizer.save,))
    objective.refresh()  # "after" scores the final Embed_doc, not an index up to refresh_every forwards stale
    result = {"passages": len(passages), "train_examples": len(examples["train"]),
              "test_examples": len(examples["test"]), "k": options.k, "refresh_every": options.refresh_every,
              "null_document": options.null_document, "steps": cfg.steps, "seed": cfg.seed, "before": before,
              "after": evaluate_realm(objective, examples["test"], passages)}
    replace_dir(out / "retriever", lambda folder: (encoder.model.save(folder), encoder.save(folder)))
    atomic_write_text(out / "realm.json", json.dumps(result, indent=2) + "\n")
    return result


def run_ict(model: str, out, cfg, passages_source: str | None = None, options: IctOptions | None = None,
            resume: bool = False, log=print) -> dict:
    """Warm-start a retriever with the inverse cloze task (ict.py) on the passages: trained from
    `model` (with separate Embed_input / Embed_doc, as REALM's), saved in out/final (a `--retriever`
    for `retrieve realm`); the in-batch accuracy of held-out pairs before and after, in out/ict.json."""
    from lmforge.retrieval.ict import ict_examples

    cfg = job_config("run_ict", cfg)
    options, out = options_of(IctOptions, options), training_folder(out)
    refuse_writing_over(out, ("model", model), ("passages_source", named_path(passages_source)),
                        writes=RUN_WRITES, holds=True)
    check_start(out, resume)  # a run there not resumed (or none to resume): before any read
    passages = load_passages(passages_source, cfg.seed)
    train_rows, test_rows = split_by_title(passages, 0.1, cfg.seed)
    encoder = BiEncoder.from_dir(model)
    if options.separate:
        encoder.separate()
    train = ict_examples(encoder, [passages[i] for i in train_rows], cfg.seed, options.keep, options.rounds)
    test = ict_examples(encoder, [passages[i] for i in test_rows], cfg.seed + 1, 0.0)
    before = in_batch_accuracy(encoder, test)
    Trainer(DPRObjective(encoder), train, cfg, out, log=log).fit(resume=resume, final_files=(encoder.save,))
    result = {"passages": len(passages), "train_pairs": len(train), "test_pairs": len(test),
              "keep": options.keep, "steps": cfg.steps, "seed": cfg.seed, "test_accuracy_before": before,
              "test_accuracy_after": in_batch_accuracy(encoder, test)}
    atomic_write_text(out / "ict.json", json.dumps(result, indent=2) + "\n")
    return result


def in_batch_accuracy(encoder: BiEncoder, examples: list) -> float:
    """Share of ICT pairs (the first 256) whose sentence scores its own context highest among all
    those pairs' contexts."""
    import torch

    objective = DPRObjective(encoder).eval()
    device = next(encoder.model.parameters()).device
    with torch.no_grad():
        loss = objective({k: v.to(device) for k, v in objective.collate(examples[:256]).items()})
    return round(float(loss.metrics["in_batch_accuracy"]), 4)
