"""Feature-based transfer: a task head trained on frozen, cached contextual features (Peters et al.
2018, ELMo; Devlin et al. 2019, sec. 5.3, BERT's feature-based NER).

The model runs once over the data (analysis/features.py); a ScalarMix over the chosen layers
(gamma * sum_j softmax(s)_j h_j) and a linear or MLP head are then trained with Adam, seeded,
with early stopping on the development split, while the model's weights never change.

- tagging: a label per word (CoNLL files, read by tasks/tagging.py read_conll); scored with
  seqeval's entity F1, precision and recall and word accuracy for BIO tags (as tasks/tagging.py),
  otherwise word accuracy and macro F1;
- classification: a label per text (JSONL {"text", "label"}), the text's words mean-pooled per
  layer; scored with accuracy, F1 and Matthews correlation (tasks/metrics.py).

Words a sentence lost to the model's max length get the most frequent training tag.
"""
from __future__ import annotations

from collections import Counter

import torch

from lmforge.analysis.features import word_features
from lmforge.analysis.probe_fit import Examples, FitConfig, Probe, fit, predict
from lmforge.config.options import OptionsError

TRANSFER_TASKS = ("tagging", "classification")
BIO_PREFIXES = ("B-", "I-", "E-", "S-", "L-", "U-")


def is_bio(tags: list) -> bool:
    """True when every tag is "O" or a chunk tag (B-X, I-X, ...): score entities, not words."""
    return all(t == "O" or t.startswith(BIO_PREFIXES) for t in tags) and any(t != "O" for t in tags)


def record_words(record: dict, kind: str) -> list:
    """The words of a record: its "words" (tagging) or its text split at white space."""
    return list(record["words"]) if kind == "tagging" else str(record["text"]).split()


def _examples(features: list, records: list, kind: str, index: dict, source: str) -> Examples:
    """Word examples (tagging) or text examples (classification, words mean-pooled) of one split."""
    if kind == "classification":
        table = torch.stack([f.mean(1) for f in features], dim=1)  # (L, S, d)
        gold = [r["label"] for r in records]
    else:
        table = torch.cat(features, dim=1)  # (L, W, d): the words that fit the model
        gold = [t for f, r in zip(features, records) for t in r["tags"][: f.shape[1]]]
    unknown = sorted({g for g in gold if g not in index} - {None})
    if unknown:
        raise ValueError(f"{source}: label(s) {unknown} never occur in the training data")
    labels = torch.tensor([[index.get(g, 0) for g in gold]], dtype=torch.long)
    return Examples(table, torch.arange(labels.shape[1])[:, None], labels)


def _standardised(splits: dict) -> dict:
    """Each layer's dimensions z-scored with the training split's statistics (see probing.standardise)."""
    train = splits["train"].table
    mean, std = train.mean(1, keepdim=True), train.std(1, keepdim=True).clamp(min=1e-6)
    return {k: Examples((e.table - mean) / std, e.index, e.labels) for k, e in splits.items()}


def _decode(predicted: list, features: list, records: list, kind: str, labels: list, fallback: str) -> list:
    """Predicted label indices -> one label per text, or one tag per word (fallback for cut words)."""
    if kind == "classification":
        return [labels[p] for p in predicted]
    out, at = [], 0
    for f, r in zip(features, records):
        n = f.shape[1]
        out.append([labels[p] for p in predicted[at: at + n]] + [fallback] * (len(r["words"]) - n))
        at += n
    return out


def score(kind: str, gold: list, predicted: list, labels: list) -> dict:
    """The task's metrics (see the module docstring)."""
    from lmforge.tasks.metrics import accuracy, classification_metrics, f1
    from lmforge.tasks.tagging import entity_scores

    if kind == "classification":
        return classification_metrics(gold, predicted, labels)
    if is_bio(labels):
        return entity_scores(gold, predicted)
    flat_gold = [t for s in gold for t in s]
    flat_predicted = [t for s in predicted for t in s]
    return {"accuracy": accuracy(flat_gold, flat_predicted), "f1": f1(flat_gold, flat_predicted, labels)}


def transfer(model, tokenizer, kind: str, splits: dict, layers="mix", pooling: str = "first",
             head: str = "linear", config: FitConfig | None = None, seed: int = 0, batch_size: int = 32,
             max_len: int | None = None) -> dict:
    """Train a feature-based head on splits {"train", "dev"[, "test"]: records}; its metrics on dev
    (and test), the mix weights and how many words the model's max length cut."""
    if kind not in TRANSFER_TASKS:
        raise OptionsError(f"kind {kind!r} is not one of {', '.join(TRANSFER_TASKS)}", "kind")
    config = config or FitConfig()
    gold_key = "tags" if kind == "tagging" else "label"
    labels = sorted({t for r in splits["train"]
                     for t in (r[gold_key] if kind == "tagging" else [r[gold_key]])})
    index = {label: i for i, label in enumerate(labels)}
    features, cut = {}, {}
    for name, records in splits.items():
        stats: dict = {}
        features[name] = word_features(model, tokenizer, [record_words(r, kind) for r in records], layers,
                                       pooling, batch_size, max_len, stats)
        cut[name] = stats.get("dropped_words", 0)
    data = _standardised({k: _examples(features[k], splits[k], kind, index, k) for k in splits})
    n_layers, d = data["train"].table.shape[0], data["train"].table.shape[-1]
    probe = Probe(d, len(labels), 1, head, config.hidden, n_mix=n_layers)
    history = fit(probe, data["train"], data["dev"], config, seed)
    fallback = (Counter(t for r in splits["train"] for t in r["tags"]).most_common(1)[0][0]
                if kind == "tagging" else "")
    out = {"task": kind, "head": head, "pooling": pooling, "labels": labels, "epochs": history["epochs"],
           "mix_weights": probe.mix.weights.detach().tolist() if probe.mix is not None else [1.0],
           "gamma": float(probe.mix.gamma.detach()) if probe.mix is not None else 1.0, "dropped_words": cut}
    for name in ("dev", "test"):
        if name in splits:
            predicted = _decode(predict(probe, data[name])[0].tolist(), features[name], splits[name], kind,
                                labels, fallback)
            out[name] = score(kind, [r[gold_key] for r in splits[name]], predicted, labels)
    return out
