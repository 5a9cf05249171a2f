"""The metrics the field reports for classification and regression, from the standard libraries:
accuracy, F1 (binary for two labels, macro-averaged otherwise), Matthews correlation (CoLA),
Pearson and Spearman correlation (STS-B). Values are plain floats."""
from __future__ import annotations

import math
import warnings


def accuracy(gold: list, predicted: list) -> float:
    """Fraction of predictions equal to the gold label."""
    _check(gold, predicted)
    return sum(g == p for g, p in zip(gold, predicted)) / len(gold)


def f1(gold: list, predicted: list, labels: list | None = None) -> float:
    """F1: binary (positive class = the second label) with two labels, macro-averaged otherwise."""
    from sklearn.metrics import f1_score

    _check(gold, predicted)
    labels = sorted(set(gold) | set(predicted)) if labels is None else list(labels)
    if len(labels) == 2:
        return float(f1_score(gold, predicted, labels=labels, pos_label=labels[1], average="binary",
                              zero_division=0))
    return float(f1_score(gold, predicted, labels=labels, average="macro", zero_division=0))


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


def _check(gold: list, predicted: list) -> None:
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold labels but {len(predicted)} predictions")
    if not gold:
        raise ValueError("no examples to score")


def _finite(value) -> float:
    value = float(value)
    return 0.0 if math.isnan(value) else value
