"""The metrics the field reports, from the standard libraries: for classification and regression
accuracy, F1 (binary for two labels, macro-averaged otherwise), Matthews correlation (CoLA),
Pearson and Spearman correlation (STS-B); for multi-label classification micro and macro F1 over the
labels and subset (exact-match) accuracy; for generated text corpus BLEU (sacrebleu, Post 2018)
and ROUGE-1/2/L (Google's rouge-score, Lin 2004). Values are plain floats."""
from __future__ import annotations

import math
import warnings


def accuracy(gold: list, predicted: list) -> float:
    """Fraction of predictions equal to the gold label."""
    _check(gold, predicted)
    return sum(g == p for g, p in zip(gold, predicted)) / len(gold)


def f1(gold: list, predicted: list, labels: list | None = None) -> float:
    """F1: binary (positive class = the second label) with two labels, macro-averaged otherwise over
    the labels that the gold or the predictions hold (scikit-learn's default)."""
    from sklearn.metrics import f1_score

    _check(gold, predicted)
    seen = set(gold) | set(predicted)
    labels = sorted(seen) if labels is None else list(labels)
    if len(labels) == 2:
        return float(f1_score(gold, predicted, labels=labels, pos_label=labels[1], average="binary",
                              zero_division=0))
    # a label neither true nor predicted in this data would count F1 0 and lower the mean: perfect
    # predictions on a split without one of three classes would score 2/3
    present = [label for label in labels if label in seen]
    return float(f1_score(gold, predicted, labels=present, average="macro", zero_division=0))


def matthews(gold: list, predicted: list) -> float:
    """Matthews correlation coefficient (0 when a side is constant)."""
    from sklearn.metrics import matthews_corrcoef

    _check(gold, predicted)
    with warnings.catch_warnings():  # one label on both sides is defined here as 0, not a warning
        warnings.simplefilter("ignore", UserWarning)
        return float(matthews_corrcoef(gold, predicted))


def pearson(gold: list, predicted: list) -> float:
    """Pearson correlation (0 when a side is constant, where it is undefined)."""
    from scipy.stats import pearsonr

    _check(gold, predicted)
    if len(gold) < 2 or len(set(gold)) < 2 or len(set(predicted)) < 2:
        return 0.0
    return _finite(pearsonr(gold, predicted)[0])


def spearman(gold: list, predicted: list) -> float:
    """Spearman rank correlation (0 when a side is constant)."""
    from scipy.stats import spearmanr

    _check(gold, predicted)
    if len(gold) < 2 or len(set(gold)) < 2 or len(set(predicted)) < 2:
        return 0.0
    return _finite(spearmanr(gold, predicted)[0])


def mse(gold: list, predicted: list) -> float:
    """Mean squared error."""
    _check(gold, predicted)
    return sum((float(g) - float(p)) ** 2 for g, p in zip(gold, predicted)) / len(gold)


def classification_metrics(gold: list, predicted: list, labels: list) -> dict:
    """accuracy (primary), f1 and matthews of label predictions."""
    return {"accuracy": accuracy(gold, predicted), "f1": f1(gold, predicted, labels),
            "matthews": matthews(gold, predicted)}


def regression_metrics(gold: list, predicted: list) -> dict:
    """pearson (primary), spearman and mse of real-valued predictions."""
    return {"pearson": pearson(gold, predicted), "spearman": spearman(gold, predicted),
            "mse": mse(gold, predicted)}


def multilabel_metrics(gold: list, predicted: list, labels: list) -> dict:
    """micro_f1 (primary), macro_f1 and subset_accuracy of label-set predictions (each a list of `labels`),
    as scikit-learn scores their indicator matrices (an F1 of a label never true nor predicted is 0)."""
    from sklearn.metrics import accuracy_score, f1_score
    from sklearn.preprocessing import MultiLabelBinarizer

    _check(gold, predicted)
    binarize = MultiLabelBinarizer(classes=list(labels)).fit([])
    y, p = binarize.transform(gold), binarize.transform(predicted)
    return {"micro_f1": float(f1_score(y, p, average="micro", zero_division=0)),
            "macro_f1": float(f1_score(y, p, average="macro", zero_division=0)),
            "subset_accuracy": float(accuracy_score(y, p))}


def bleu(gold: list, predicted: list) -> float:
    """Corpus BLEU (0-100) of predicted texts against one reference each: sacrebleu's defaults
    (13a tokenisation, "exp" smoothing): the BLEU that translation papers report since 2018."""
    import sacrebleu

    _check(gold, predicted)
    return float(sacrebleu.corpus_bleu(list(predicted), [list(gold)]).score)


def rouge(gold: list, predicted: list) -> dict:
    """ROUGE-1, ROUGE-2 and ROUGE-L F-measures (0-100), each the mean over the texts, computed by
    rouge-score with its Porter stemmer (as the reference library's summarisation scripts do). Its
    tokenizer keeps [a-z0-9] alone: text in another script (Cyrillic, Chinese) has no words and scores 0."""
    from rouge_score import rouge_scorer

    _check(gold, predicted)
    kinds = ("rouge1", "rouge2", "rougeL")
    scorer = rouge_scorer.RougeScorer(list(kinds), use_stemmer=True)
    scores = [scorer.score(g, p) for g, p in zip(gold, predicted)]  # (target, prediction), in this order
    return {k: 100 * sum(s[k].fmeasure for s in scores) / len(scores) for k in kinds}


def generation_metrics(gold: list, predicted: list) -> dict:
    """bleu (primary), rouge1, rouge2, rougeL of generated texts, and gen_len (mean words)."""
    words = sum(len(p.split()) for p in predicted) / max(len(predicted), 1)
    return {"bleu": bleu(gold, predicted), **rouge(gold, predicted), "gen_len": words}


def _check(gold: list, predicted: list) -> None:
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold labels but {len(predicted)} predictions")
    if not gold:
        raise ValueError("no examples to score")


def _finite(value) -> float:
    value = float(value)
    return 0.0 if math.isnan(value) else value
