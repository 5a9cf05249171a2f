"""Training the dense retriever on the one trainer, and for BM25, an untrained encoder and a trained one,
side by side: recall@k (the share of questions with a positive passage among the k retrieved) and
accuracy@k, DPR's top-k retrieval accuracy (Karpukhin et al. 2020, sec. 5.1: the share of questions with
an answer string in the text of one of the k retrieved; has_answer's "string" match)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lmforge.retrieval.answers import has_answer
from lmforge.retrieval.bm25 import BM25Index, hard_negatives
from lmforge.retrieval.dpr import BiEncoder, DPRObjective, passage_text, training_examples
from lmforge.retrieval.index import DenseIndex, write_index
from lmforge.train import TrainConfig
from lmforge.train.loop import Trainer
from lmforge.utils.atomic import atomic_write_text

KS = (1, 5, 20)
VECTOR_OPTIONS = ("pooling", "normalize", "max_length")


def recall_at_k(rankings: list, records: list, ks=KS) -> dict:
    """{"recall@k": share of records with one of their positives among the first k ranked ids}."""
    hits = {k: 0 for k in ks}
    for ranked, r in zip(rankings, records):
        positives = set(r["positives"])
        for k in ks:
            hits[k] += bool(positives & set(ranked[:k]))
    return {f"recall@{k}": hits[k] / max(1, len(records)) for k in ks}


def passage_texts(passages: list) -> dict:
    """{passage id: its text}: what accuracy@k matches answers in (not titles), built once per comparison."""
    return {p.id: p.text for p in passages}


def answer_accuracy_at_k(rankings: list, records: list, passages: list, ks=KS,
                         texts: dict | None = None) -> dict:
    """{"accuracy@k": share of records with an answer string in the text of one of the first k ranked
    passages} (DPR's top-k retrieval accuracy: it matches passage texts, not titles); `texts`: the
    passages' passage_texts where the caller has it."""
    texts = passage_texts(passages) if texts is None else texts
    hits = {k: 0 for k in ks}
    for ranked, r in zip(rankings, records):
        found = [has_answer(r["answers"], texts[pid]) for pid in ranked[:max(ks, default=0)]]
        for k in ks:
            hits[k] += any(found[:k])
    return {f"accuracy@{k}": hits[k] / max(1, len(records)) for k in ks}


def answerable(records: list, passages: list, texts: dict | None = None) -> bool:
    """Whether some record's answer is in the text of one of its positives: questions whose passages never
    hold their answers (the built-in dictionary's, whose answer is the headword a definition leaves out)
    would score accuracy@k 0 at any rank. `texts`: the passages' passage_texts where the caller has it."""
    texts = passage_texts(passages) if texts is None else texts
    return any(any(has_answer(r.get("answers") or [], texts.get(pid, "")) for pid in r["positives"])
               for r in records)


def retrieval_metrics(rankings: list, records: list, passages: list, ks=KS,
                      accuracy: bool | None = None, texts: dict | None = None) -> dict:
    """recall@k (a positive among the first k) and accuracy@k (an answer in one of them) of `rankings`; the
    latter where the records are `answerable` (`accuracy`: that, already known for these records; `texts`:
    the passages' passage_texts, already built)."""
    texts = passage_texts(passages) if texts is None else texts
    accuracy = answerable(records, passages, texts) if accuracy is None else accuracy
    found = answer_accuracy_at_k(rankings, records, passages, ks, texts) if records and accuracy else {}
    return {**recall_at_k(rankings, records, ks), **found}


def bm25_rankings(index: BM25Index, passages: list, records: list, k: int) -> list:
    """Passage ids ranked by BM25 for each question."""
    positions, _ = index.search([r["question"] for r in records], k)
    return [[passages[int(i)].id for i in row] for row in positions]


def encode_passages(encoder: BiEncoder, passages: list, path, batch_size: int = 64, progress: bool = False,
                    model_name: str = "") -> DenseIndex:
    """Embed every passage into an index directory at `path` and open it."""
    def encode(rows):
        return encoder.encode([passage_text(passages[i]) for i in rows], batch_size, passage=True)

    write_index(path, [p.id for p in passages], encode, encoder.width, model=model_name,
                pooling=encoder.options.pooling, batch_size=batch_size, progress=progress,
                encoder=encoder.fingerprint(), options=vector_options(encoder.options),
                tokenizer=encoder.tokenizer_fingerprint())
    return DenseIndex.load(path)


def vector_options(options) -> dict:
    """The EncoderOptions fields that make a text's vector (a query must be embedded as the passages were)."""
    return {name: getattr(options, name) for name in VECTOR_OPTIONS}


def dense_rankings(encoder: BiEncoder, index: DenseIndex, records: list, k: int) -> list:
    """Passage ids ranked by inner product with each question's embedding."""
    _, positions = index.search(encoder.encode([r["question"] for r in records]), k)
    return [[index.ids[int(i)] for i in row] for row in positions]


def train_dpr(encoder: BiEncoder, records: list, passages: list, out, cfg: TrainConfig, n_hard: int = 1,
              resume: bool = False, log=print) -> BiEncoder:
    """Train `encoder` in place on question records with in-batch and `n_hard` BM25 hard negatives per
    question (the one trainer: metrics.jsonl, checkpoints, out/final with tokenizer and retriever.json,
    and a separate passage encoder, if any, in out/final/passage)."""
    bm25 = BM25Index.build(passages)
    negatives = hard_negatives(bm25, records, passages, n_hard) if n_hard else [[] for _ in records]
    examples = training_examples(encoder, records, passages, negatives)
    trainer = Trainer(DPRObjective(encoder), examples, cfg, out, log=log)
    trainer.fit(resume=resume, final_files=(encoder.save,))
    return encoder


def compare(passages: list, records: list, encoders: dict, work, k: int = max(KS)) -> dict:
    """{"bm25": metrics, name: metrics for each encoder} on `records` (retrieval_metrics: recall@k and DPR's
    accuracy@k; dense indexes under `work`)."""
    ranked = bm25_rankings(BM25Index.build(passages), passages, records, k)
    texts = passage_texts(passages)  # once for every table
    accuracy = answerable(records, passages, texts)
    table = {"bm25": retrieval_metrics(ranked, records, passages, accuracy=accuracy, texts=texts)}
    for name, encoder in encoders.items():
        index = encode_passages(encoder, passages, Path(work) / f"index-{name}")
        ranked = dense_rankings(encoder, index, records, k)
        table[name] = retrieval_metrics(ranked, records, passages, accuracy=accuracy, texts=texts)
    return table


def write_table(table: dict, path) -> Path:
    """The comparison as JSON (numbers rounded to 4 places)."""
    path = Path(path)
    rounded = {n: {k: round(float(v), 4) for k, v in r.items()} for n, r in table.items()}
    atomic_write_text(path, json.dumps(rounded, indent=2) + "\n")
    return path


def mean_reciprocal_rank(rankings: list, records: list) -> float:
    """Mean over questions of 1 / rank of the first positive (0 when none is ranked)."""
    ranks = [next((1 / (i + 1) for i, pid in enumerate(ranked) if pid in set(r["positives"])), 0.0)
             for ranked, r in zip(rankings, records)]
    return float(np.mean(ranks)) if ranks else 0.0
