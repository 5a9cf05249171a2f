"""What a worker thread runs for each kind of job: the library's own entry points, batched.

Embedding jobs of one model (and one `normalize`) are encoded together by SentenceEncoder.encode:
one forward pass over texts of mixed lengths, which the optimized model runs unpadded (fast/execution.py,
"auto": packed real tokens for every position-wise layer, attention per sequence), so a batch costs its
real tokens rather than rows x longest. Prediction jobs of one task model go through Task.outputs
the same way, and each job's records are decoded by Task.decode. Results are plain Python: the
event loop never touches a tensor.
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

from lmforge.pipelines.fill_mask import fill_mask
from lmforge.tasks.qa import best_answer, window_spans


def embed_batch(served, payloads: list) -> list:
    """Embeddings of every job's texts from one embed_counted run (one EmbedOptions: the jobs' key); per
    job, a list of (vector in the options' encoding, {tokens, truncated, chunks, dim}). The texts hold their
    prompt (the options none): each one's leads, the prompt's tokens the pooling may leave out, go along,
    and its tokens as the route counted them (the texts as the model reads them: the route lowercased them
    where it lowercases, and embed_counted reads them as given)."""
    texts = [t for p in payloads for t in p["texts"]]
    leads = [n for p in payloads for n in p["leads"]]
    counts = [n for p in payloads for n in p["counts"]]
    # the route counted them with the encoder's tokenizer: trusted, not counted (nor lowered) again
    found = served.encoder.embed_counted(texts, payloads[0]["options"], max(1, len(texts)), None, None, leads,
                                         counts)
    vectors, dim = found.output(), found.vectors.shape[1]
    info = [{"tokens": n, "truncated": cut, "chunks": c, "dim": dim}
            for n, cut, c in zip(found.tokens, found.truncated, found.chunks)]
    return _per_job(payloads, list(zip(vectors, info)))


def _per_job(payloads: list, results: list) -> list:
    """`results` of every job's texts, one list per job."""
    out, at = [], 0
    for p in payloads:
        out.append(results[at:at + len(p["texts"])])
        at += len(p["texts"])
    return out


def features_batch(served, payloads: list) -> list:
    """Contextual features of every job's texts in one pass (one FeatureOptions: the jobs' key)."""
    from lmforge.analysis.text_features import text_features

    texts = [t for p in payloads for t in p["texts"]]
    options = payloads[0]["options"]
    found = text_features(served.model, served.tokenizer, texts, options, batch_size=max(1, len(texts)))
    return _per_job(payloads, [f.as_json(options.pooling == "none") for f in found])


def predict_batch(served, payloads: list) -> list:
    """Predictions of every job's records: their examples run together, decoded job by job."""
    task = served.task
    per_job = [task.encode_all(p["records"]) for p in payloads]
    examples = [e for job in per_job for e in job]
    outputs = task.outputs(examples, batch_size=max(1, len(examples)))  # choice: as many choices a batch
    out, at = [], 0
    for p, job in zip(payloads, per_job):
        mine = outputs[at:at + len(job)]
        at += len(job)
        predictions = task.decode(p["records"], job, mine)
        parts = [([], []) for _ in p["records"]]  # each record's examples (QA: windows) and outputs
        for example, output in zip(job, mine):
            parts[example["record"]][0].append(example)
            parts[example["record"]][1].append(output)
        out.append([describe(task, record, prediction, *part)
                    for record, prediction, part in zip(p["records"], predictions, parts)])
    return out


def _softmax(scores: list) -> list:
    top = max(scores)
    exp = [math.exp(s - top) for s in scores]
    return [e / sum(exp) for e in exp]


def describe(task, record: dict, prediction, examples: list, outputs: list) -> dict:
    """One record's prediction as the API returns it (see schemas.Prediction)."""
    kind = task.kind
    if kind in ("cls", "pair"):
        scores = outputs[0]
        if task.head == "lm":  # text-to-text: log-likelihood of each label's text, made a distribution
            scores = _softmax(scores)
        return {"label": prediction, "scores": dict(zip(task.labels, scores))}
    if kind == "regression":
        return {"value": float(prediction)}
    if kind == "multilabel":  # the labels over the threshold, and each label's sigmoid
        labels = list(map(str, task.labels))  # id2label may name outputs by numbers
        return {"labels": [str(x) for x in prediction], "scores": dict(zip(labels, outputs[0]))}
    if kind == "choice":
        return {"choice": int(prediction), "scores": list(outputs[0])}
    if kind == "tagging":
        return {"tags": [{"word": w, "tag": t} for w, t in zip(record["words"], prediction)]}
    if kind == "qa":
        return qa_answer(task, record, examples, outputs)
    return {"text": prediction}  # seq2seq


def qa_answer(task, record: dict, windows: list, outputs: list) -> dict:
    """The answer of qa.best_answer with its character span in the context."""
    text, score = best_answer(windows, outputs, record["context"], task.n_best, task.max_answer_len,
                              bool(task.unanswerable), task.null_threshold)
    start = end = None
    for window, (starts, ends) in zip(windows, outputs) if text else ():
        spans = window_spans(starts, ends, window["context_at"], len(window["offsets"]), task.n_best,
                             task.max_answer_len)
        if spans and spans[0][0] == score:  # the window best_answer took its answer from
            start, end = window["offsets"][spans[0][1]][0], window["offsets"][spans[0][2]][1]
            break
    return {"answer": text, "start": start, "end": end, "score": float(score) if score is not None else None}


def fill_mask_one(served, payload: dict) -> list:
    """The top-k fillings of one text's mask, as lmforge.fill_mask gives them."""
    found = fill_mask(served.model, served.tokenizer, payload["text"], top_k=payload["top_k"],
                      max_span=payload["max_span"])
    return [{"token": c.token, "score": c.score, "sequence": c.sequence, "token_id": c.token_id}
            for c in found]


def attention_page(served, payload: dict) -> str:
    """The self-contained attention view (analysis/view.py) of one text, as HTML."""
    from lmforge.analysis.attention import attention_maps  # on first use: a server start does not pay for it
    from lmforge.analysis.view import write_html

    maps = attention_maps(served.model, served.tokenizer, payload["text"], pair=payload["text_pair"],
                          layers=payload["layers"])
    maps.title = f"{served.name}: {payload['text'][:80]}"
    with tempfile.TemporaryDirectory(prefix="lmforge-attention-") as where:
        page = Path(where) / "view.html"
        write_html(maps, page, max_bytes=payload["max_bytes"])
        return page.read_text(encoding="utf-8")


BATCHED = {"embed": embed_batch, "predict": predict_batch, "features": features_batch}
ALONE = {"fill_mask": fill_mask_one, "attention": attention_page}  # run one at a time, between steps
EXCLUSIVE = {"attention"}  # they change the model while they run (model.inspection): no batch beside them
