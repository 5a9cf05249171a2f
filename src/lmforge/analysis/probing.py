"""Probing classifiers over every layer's word vectors: where does a model keep what?

Every layer's hidden states are computed once (analysis/features.py) and each probe reads them
frozen. Tasks over treebank records (lmforge.data.treebank, or a CoNLL-U file):

- "pos": a word's UPOS tag (a token label);
- "deps": the relation of a (dependent, head) pair (Tenney et al. 2019's edge probing with
  one-word spans: the two vectors concatenated, then classified);
- "agreement", "coref": the long-range links as pair classification (is this noun the verb's
  subject or an attractor; the pronoun's antecedent or another noun);
- "distance", "depth": the structural probes of analysis/structural_probe.py.

For each label task: a linear and an MLP probe per layer, each also on Hewitt & Liang's (2019)
control task (every word type, the word as written, gets a random label drawn once from the task's
training label distribution, the same in every split) and selectivity = task accuracy - control
accuracy. For a pair the type is its first word's (the dependent; a link's noun): lmforge's own
extension, as the paper's one pair control (each type attaches to itself, the first or the last word)
is for predicting a word's head, a probe lmforge does not fit ("deps" labels a gold arc). Then the
scalar-mix probe over all layers with its centre of gravity E[l] = sum_l l s_l; and Tenney et al.'s
(2019, "BERT rediscovers the classical NLP pipeline") cumulative scoring:
probes P_l on the mix of layers 0..l, differential scores Delta_l = score(P_l) - score(P_(l-1)) (on
the running best score, see `differential_scores`) and the expected layer sum_l l Delta_l / sum_l
Delta_l. Everything is seeded.
"""
from __future__ import annotations

import random
import zlib
from collections import Counter
from dataclasses import dataclass
from itertools import pairwise

import torch

from lmforge.analysis.probe_fit import (HEADS, Examples, FitConfig, LayerProbes, PrefixMixProbes, Probe,
                                        accuracy, fit)
from lmforge.analysis.structural_probe import Sentences, right_branching_uuas, train_structural
from lmforge.config.options import OptionsError

LABEL_TASKS = ("pos", "deps", "agreement", "coref")
STRUCTURAL_TASKS = ("distance", "depth")
TASKS = LABEL_TASKS + STRUCTURAL_TASKS
LONG_RANGE = ("agreement", "coref")
SPLITS = ("train", "dev", "test")


def probe_seed(seed: int, *parts) -> int:
    """A probe's own seed from the run's seed and its name: independent of the order probes run in."""
    return zlib.crc32(f"{seed}/{'/'.join(map(str, parts))}".encode())


@dataclass
class Split:
    """One split's word table H (L, W, d), sentence offsets into W and its treebank records."""

    table: torch.Tensor
    offsets: list
    records: list

    @classmethod
    def of(cls, features: list, records: list) -> Split:
        """From word_features' per-sentence (L, n_words, d) tensors and their records."""
        offsets = torch.tensor([0] + [f.shape[1] for f in features]).cumsum(0).tolist()
        return cls(torch.cat(features, dim=1), offsets, records)


def standardise(splits: dict) -> dict:
    """Each layer's dimensions z-scored with the training split's statistics: an affine map a linear
    probe can undo, so it changes no probe's reach, only how evenly Adam's steps fit every layer."""
    train = splits["train"].table
    mean, std = train.mean(1, keepdim=True), train.std(1, keepdim=True).clamp(min=1e-6)  # (L, 1, d)
    return {k: Split((s.table - mean) / std, s.offsets, s.records) for k, s in splits.items()}


def task_items(records: list, offsets: list, task: str) -> list:
    """(word indices into the table, label, word type of the first word) of every example of a
    label task; words a sentence lost to truncation are never used."""
    items = []
    for s, record in enumerate(records):
        start, n = offsets[s], offsets[s + 1] - offsets[s]
        words = record["words"]
        if task == "pos":
            pairs = [((i,), record["upos"][i]) for i in range(len(words))]
        elif task == "deps":
            pairs = [((i, h), rel)
                     for i, (h, rel) in enumerate(zip(record["heads"], record["deprels"])) if h >= 0]
        else:
            pairs = [((i, j), label) for kind, i, j, label in record.get("links", []) if kind == task]
        # the type is the word as written, as Hewitt & Liang's code keys it: folding case would let
        # "The" share "the"'s control label, a control task easier to memorise than theirs
        items += [(tuple(start + w for w in words_), label, words[words_[0]])
                  for words_, label in pairs if max(words_) < n]
    return items


def control_labels(types: list, labels: list, seed: int) -> dict:
    """Hewitt & Liang's control task: for every word type a label drawn once, independently, from
    the empirical distribution of `labels`; {type: label}."""
    counts = Counter(labels)
    population = sorted(counts)
    rng = random.Random(seed)
    return {t: rng.choices(population, weights=[counts[x] for x in population])[0]
            for t in sorted(set(types))}


def label_examples(splits: dict, task: str, seed: int, control: bool = True) -> tuple:
    """({split: Examples over all layers}, label names) of a label task: label set 0 the task's,
    label set 1 (with control) its control task's."""
    items = {k: task_items(s.records, s.offsets, task) for k, s in splits.items()}
    if not items["train"] or not items["test"]:
        raise ValueError(f"probe task {task!r} has no examples in the data (train {len(items['train'])}, "
                         f"test {len(items['test'])})")
    names = sorted({label for _, label, _ in items["train"]})
    index = {name: i for i, name in enumerate(names)}
    # a dev or test label never seen in training stays, as an index no probe can give: it counts as wrong,
    # as in the papers' accuracies (left out, it raised every score over a smaller test set)
    sets = [lambda it: index.get(it[1], len(names))]
    if control:
        mapping = control_labels([t for v in items.values() for _, _, t in v],
                                 [label for _, label, _ in items["train"]], probe_seed(seed, task, "control"))
        sets.append(lambda it: index[mapping[it[2]]])
    arity = len(items["train"][0][0])
    out = {k: Examples(splits[k].table,
                       torch.tensor([w for w, _, _ in v], dtype=torch.long).view(len(v), arity),
                       torch.tensor([[label(it) for it in v] for label in sets],
                                    dtype=torch.long).view(len(sets), len(v)))
           for k, v in items.items()}
    return out, names


def _layer_slice(examples: dict, layers: slice) -> dict:
    """The examples over some of the table's layers (a view, never a copy of the table)."""
    return {k: Examples(e.table[layers], e.index, e.labels) for k, e in examples.items()}


def per_layer(examples: dict, layers: list, head: str, config: FitConfig, seed: int, task: str) -> dict:
    """Task (and control) test accuracy of a `head` probe on each layer alone, their difference
    (selectivity) and the best layer, chosen on the development split's accuracy (never on test's);
    table position p holds layers[p]."""
    n_sets, train = examples["train"].labels.shape[0], examples["train"]
    groups = [(p, s) for p in range(len(layers)) for s in range(n_sets)]
    probes = LayerProbes(train.index.shape[1] * train.table.shape[-1], int(train.labels[0].max()) + 1,
                         [p for p, _ in groups], [s for _, s in groups], head, config.hidden)
    history = fit(probes, train, examples["dev"], config, probe_seed(seed, task, head))
    test = accuracy(probes, examples["test"]).view(len(layers), n_sets).T.tolist()  # (sets, layers)
    dev = torch.tensor(history["dev"]).view(len(layers), n_sets)[:, 0].tolist()
    best = max(range(len(layers)), key=dev.__getitem__)
    out = {"accuracy": test[0], "dev_accuracy": dev, "best_layer": layers[best]}
    if n_sets > 1:
        out.update(control=test[1], selectivity=[a - c for a, c in zip(test[0], test[1])])
    return out


def center_of_gravity(weights: list, layers: list) -> float:
    """Tenney et al.'s centre of gravity E[l] = sum_l l s_l of scalar-mix weights s over `layers`."""
    return float(sum(layer * s for layer, s in zip(layers, weights)) / sum(weights))


def expected_layer(scores: list, layers: list) -> float:
    """Tenney et al.'s expected layer of cumulative scores (scores[i]: the probe of layers[:i + 1]):
    sum_l l Delta_l / sum_l Delta_l over the layers after the first; nan when the scores never rise."""
    deltas = differential_scores(scores)
    total = sum(deltas)
    if not total > 0:
        return float("nan")
    return float(sum(layer * d for layer, d in zip(layers[1:], deltas)) / total)


def differential_scores(scores: list) -> list:
    """Delta_l of cumulative scores, taken on their running best: the mix of layers 0..l can do what
    the mix of 0..l-1 does, so a drop is training noise, and a negative Delta would push the expected
    layer outside the layers (Tenney et al.'s deltas are positive in practice)."""
    best = [max(scores[: i + 1]) for i in range(len(scores))]
    return [b - a for a, b in pairwise(best)]


def mix_probe(examples: dict, n: int, head: str, config: FitConfig, seed: int) -> tuple:
    """(test accuracy, scalar-mix weights) of one probe on the mix of the table's first n layers
    (`cumulative` fits every prefix at once; this is the one-probe form)."""
    data = _layer_slice(examples, slice(0, n))
    train = data["train"]
    probe = Probe(train.table.shape[-1], int(train.labels[0].max()) + 1, train.index.shape[1], head,
                  config.hidden, n_mix=n)
    fit(probe, train, data["dev"], config, seed)
    weights = probe.mix.weights.detach().tolist() if probe.mix is not None else [1.0]
    return float(accuracy(probe, data["test"])[0]), weights


def cumulative(examples: dict, layers: list, head: str, config: FitConfig, seed: int, task: str) -> dict:
    """Cumulative scoring (P_l on the mix of layers[:l + 1], all L probes trained together in one
    batched module, each as it would alone) and the full mix's weights and centre of gravity."""
    train = examples["train"]
    probes = PrefixMixProbes(train.table.shape[-1], int(train.labels[0].max()) + 1, len(layers),
                             train.index.shape[1], head, config.hidden)
    fit(probes, train, examples["dev"], config, probe_seed(seed, task, "mix"))
    scores = accuracy(probes, examples["test"]).tolist()
    weights = probes.mix.weights[-1].detach().tolist()
    return {"scores": scores, "deltas": differential_scores(scores),
            "expected_layer": expected_layer(scores, layers), "mix_weights": weights,
            "center_of_gravity": center_of_gravity(weights, layers), "mix_accuracy": scores[-1]}


def probe_label_task(splits: dict, task: str, layers: list, config: FitConfig, seed: int,
                     heads: tuple = HEADS, control: bool = True, mix_head: str = "mlp") -> dict:
    """Every probe of one label task: per layer and head (with control), the mix and cumulative scores."""
    examples, names = label_examples(splits, task, seed, control)
    test = examples["test"].labels[0]
    majority = int(torch.bincount(examples["train"].labels[0]).argmax())
    result = {"labels": names, "examples": {k: len(e) for k, e in examples.items()},
              "majority": float((test == majority).float().mean())}
    for head in heads:
        result[head] = per_layer(examples, layers, head, config, seed, task)
    result["cumulative"] = cumulative(examples, layers, mix_head, config, seed, task)
    return result


def probe_structural_task(splits: dict, task: str, layers: list, config: FitConfig, seed: int) -> dict:
    """A distance or depth probe on each layer: its scores per layer and the best layer, the one with
    the least development loss (never chosen on test's scores)."""
    data = [Sentences(splits[k].table, splits[k].offsets, splits[k].records, task) for k in SPLITS]
    rows = train_structural(task, *data, list(range(len(layers))), config, probe_seed(seed, task))
    result = {key: [r[key] for r in rows] for key in rows[0]}
    result["best_layer"] = layers[min(range(len(layers)), key=result["dev_loss"].__getitem__)]
    return result


def available_tasks(*splits: list) -> list:
    """The tasks every one of `splits` (lists of records) supports: links exist only in the built-in
    treebank, and a few of its sentences may hold no link of a kind (a probe needs train and test)."""
    kinds = [{link[0] for r in records for link in r.get("links", [])} for records in splits]
    return [t for t in TASKS if t not in LONG_RANGE or all(t in k for k in kinds)]


def probe_sweep(features: dict, records: dict, layers: list, tasks: list | None = None,
                config: FitConfig | None = None, seed: int = 0, heads: tuple = HEADS, control: bool = True,
                progress=None) -> dict:
    """All probes of `tasks` on every layer in `layers` (indices into each (L, n, d) feature tensor,
    named by those numbers): features and records are {train, dev, test: per-sentence lists}."""
    config = config or FitConfig()
    tasks = tasks or available_tasks(records["train"], records["test"])
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise OptionsError(f"tasks: unknown task(s) {unknown}; tasks: {', '.join(TASKS)}", "tasks")
    splits = {k: Split.of([f[layers] for f in features[k]], records[k]) for k in SPLITS}
    splits = standardise(splits)  # table position p now holds layers[p]
    results = {"layers": layers, "tasks": {}}
    for task in tasks:
        if progress:
            progress(task)
        if task in LABEL_TASKS:
            results["tasks"][task] = probe_label_task(splits, task, layers, config, seed, heads, control)
        else:
            results["tasks"][task] = probe_structural_task(splits, task, layers, config, seed)
    results["baselines"] = baselines(results, records["test"], layers)
    return results


def baselines(results: dict, test_records: list, layers: list) -> dict:
    """The right-branching chain's UUAS and the embedding layer's (layer 0) scores where probed."""
    out = {"right_branching_uuas": right_branching_uuas(test_records)}
    if 0 in layers:
        at = layers.index(0)
        layer0 = {}
        for task, r in results["tasks"].items():
            for key in ("uuas", "root_accuracy"):
                if key in r:
                    layer0[f"{task}_{key}"] = r[key][at]
            if "mlp" in r or "linear" in r:
                layer0[task] = r.get("mlp", r.get("linear"))["accuracy"][at]
        out["layer0"] = layer0
    return out
