"""Probing: control tasks, the scalar mix's centre of gravity, cumulative scoring, batched probes that
train as they would alone, and a seeded sweep over a tiny model."""
import json
import math
from collections import Counter

import pytest
import torch

from lmforge.analysis.features import word_features
from lmforge.analysis.probe_fit import Examples, FitConfig, LayerProbes, PrefixMixProbes, Probe, accuracy, fit
from lmforge.analysis.probe_report import summary
from lmforge.analysis.probing import (Split, center_of_gravity, control_labels, cumulative,
                                      differential_scores, expected_layer, label_examples, mix_probe,
                                      per_layer, probe_sweep, task_items)
from lmforge.data.treebank import treebank_splits
from lmforge.tokenizer import train_tokenizer

TINY = FitConfig(epochs=4, hidden=16, rank=8, batch_size=64, lr=1e-2)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def swept():
    """(features, records) of a small treebank under a tiny random BERT with a tokenizer of its words."""
    import lmforge

    records = treebank_splits(90, seed=0, held_out=0.2)
    tok = train_tokenizer([" ".join(r["words"]) for r in records["train"]], "wordpiece", 400)
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base", vocab_size=tok.vocab_size, max_seq_len=128)).eval()
    features = {k: word_features(model, tok, [r["words"] for r in v]) for k, v in records.items()}
    return features, records


def test_control_labels_are_fixed_per_type_with_the_tasks_label_distribution():
    labels = ["NOUN"] * 600 + ["VERB"] * 300 + ["DET"] * 100
    types = [f"w{i}" for i in range(4000)]
    mapping = control_labels(types + types[:50], labels, seed=1)
    assert set(mapping) == set(types) and set(mapping.values()) == {"NOUN", "VERB", "DET"}
    share = Counter(mapping.values())
    for label, p in (("NOUN", 0.6), ("VERB", 0.3), ("DET", 0.1)):
        assert abs(share[label] / len(types) - p) < 0.03
    assert control_labels(types, labels, seed=1) == mapping and \
        control_labels(types, labels, seed=2) != mapping


def test_a_word_type_has_one_control_label_in_every_split(swept):
    features, records = swept
    splits = {k: Split.of(features[k], records[k]) for k in features}
    examples, names = label_examples(splits, "pos", seed=0)
    by_type = {}
    for k, e in examples.items():
        types = [w for r in records[k] for w in r["words"]]
        assert len(types) == len(e)
        for t, control in zip(types, e.labels[1].tolist()):
            assert by_type.setdefault(t, control) == control
    assert len(set(by_type.values())) > 1 and names == sorted(names)


def _featureless_splits(n: int = 120) -> dict:
    """The built-in treebank's splits over a zero word table: control labels need no model."""
    records = treebank_splits(n, seed=0, held_out=0.2)
    return {k: Split.of([torch.zeros(1, len(r["words"]), 2) for r in v], v) for k, v in records.items()}


@pytest.mark.parametrize("task", ["deps", "agreement", "coref"])
def test_a_pair_tasks_control_label_is_its_first_words_in_every_split(task):
    # one draw per type of the pair's first word (the dependent; the noun of a link), whatever the
    # second word and the pair's real label: a function of word identity, fixed over train/dev/test
    splits = _featureless_splits()
    examples, names = label_examples(splits, task, seed=0)
    by_type, real_by_type = {}, {}
    for k, e in examples.items():
        words = [w for r in splits[k].records for w in r["words"]]  # the table's words, in order
        assert e.index.shape[1] == 2
        for (first, _), real, control in zip(e.index.tolist(), e.labels[0].tolist(), e.labels[1].tolist()):
            t = words[first]
            assert by_type.setdefault(t, control) == control, (task, t)
            real_by_type.setdefault(t, set()).add(real)
    assert any(len(v) > 1 for v in real_by_type.values())  # a type whose pairs differ in the real label
    assert len(set(by_type.values())) > 1 and set(by_type.values()) <= set(range(len(names)))


def test_control_labels_repeat_under_a_fixed_seed_and_come_from_training_labels():
    splits = _featureless_splits()
    for task in ("pos", "deps"):
        first, names = label_examples(splits, task, seed=3)
        again, _ = label_examples(splits, task, seed=3)
        other, _ = label_examples(splits, task, seed=4)
        assert all(torch.equal(first[k].labels, again[k].labels) for k in first)
        assert any(not torch.equal(first[k].labels[1], other[k].labels[1]) for k in first)
        assert all(torch.equal(first[k].labels[0], other[k].labels[0]) for k in first)  # the task's own
        trained = set(first["train"].labels[0].tolist())
        assert all(set(e.labels[1].tolist()) <= trained for e in first.values())


def test_control_types_are_words_as_written():
    # Hewitt & Liang key a type by its string: "The" and "the" are two types, each its own draw
    record = {"words": ["The", "dog", "saw", "the", "cat"], "upos": ["DET", "NOUN", "VERB", "DET", "NOUN"],
              "heads": [1, 2, -1, 4, 2], "deprels": ["det", "nsubj", "root", "det", "obj"]}
    assert [t for _, _, t in task_items([record], [0, 5], "pos")] == record["words"]


def test_a_test_label_unseen_in_training_counts_against_the_probe():
    # accuracy is over the whole test set: a label training never showed is a miss, not left out
    def record(words, tags):
        return {"words": words, "upos": tags, "heads": [-1] + [0] * (len(words) - 1),
                "deprels": ["root"] + ["dep"] * (len(words) - 1)}

    train = [record(["the", "dog"], ["DET", "NOUN"])] * 4
    test = [record(["the", "dog", "runs"], ["DET", "NOUN", "VERB"])]
    splits = {k: Split.of([torch.randn(1, len(r["words"]), 4) for r in v], v)
              for k, v in {"train": train, "dev": train, "test": test}.items()}
    examples, names = label_examples(splits, "pos", seed=0)
    assert names == ["DET", "NOUN"] and len(examples["test"]) == 3
    best_possible = Probe(4, len(names))  # right on every word a probe can be right on: DET, NOUN, NOUN
    best_possible.forward = lambda x: torch.eye(2)[[0, 1, 1]][None]
    assert float(accuracy(best_possible, examples["test"])[0]) == pytest.approx(2 / 3)


def test_task_items_words_and_pairs_and_truncation():
    record = {"words": ["the", "dog", "runs", "."], "upos": ["DET", "NOUN", "VERB", "PUNCT"],
              "heads": [1, 2, -1, 2], "deprels": ["det", "nsubj", "root", "punct"],
              "links": [["agreement", 1, 2, "subject"]]}
    assert [i[:2] for i in task_items([record], [0, 4], "pos")] == [((0,), "DET"), ((1,), "NOUN"),
                                                                    ((2,), "VERB"), ((3,), "PUNCT")]
    assert task_items([record], [0, 4], "deps") == [((0, 1), "det", "the"), ((1, 2), "nsubj", "dog"),
                                                    ((3, 2), "punct", ".")]
    assert task_items([record, record], [0, 4, 8], "agreement")[1] == ((5, 6), "subject", "dog")
    assert task_items([record], [0, 2], "deps") == [((0, 1), "det", "the")]  # words 2, 3 cut off


def test_centre_of_gravity_of_known_weights():
    assert center_of_gravity([0.1, 0.2, 0.7], [0, 1, 2]) == pytest.approx(1.6)
    assert center_of_gravity([0.1, 0.2, 0.7], [2, 4, 6]) == pytest.approx(5.2)
    assert center_of_gravity([1.0], [3]) == 3


def test_expected_layer_of_cumulative_scores():
    assert expected_layer([0.5, 0.7, 0.8, 0.8], [0, 1, 2, 3]) == pytest.approx((1 * 0.2 + 2 * 0.1) / 0.3)
    # a drop is noise: the running best (0.5, 0.8, 0.8, 0.9) gives deltas 0.3, 0, 0.1
    assert differential_scores([0.5, 0.8, 0.7, 0.9]) == pytest.approx([0.3, 0.0, 0.1])
    assert expected_layer([0.5, 0.8, 0.7, 0.9], [0, 1, 2, 3]) == pytest.approx(1.5)
    assert math.isnan(expected_layer([0.9, 0.8, 0.9], [0, 1, 2]))


def test_batched_probes_train_as_they_would_alone():
    torch.manual_seed(0)
    table = torch.randn(2, 300, 8)
    labels = (table[0, :, 0] > 0).long()
    index = torch.arange(300)[:, None]
    noise = torch.randint(0, 2, (300,))

    def train(second):  # probe 0: layer 0, the real labels; probe 1: layer 1, `second`
        data = Examples(table, index, torch.stack([labels, second]))
        probes = LayerProbes(8, 2, [0, 1], [0, 1], "mlp", 16)
        fit(probes, data, data, FitConfig(epochs=6, batch_size=32, patience=2), seed=3)
        return probes

    a, b = train(noise), train(labels)
    for wa, wb in zip(a.weights, b.weights):
        assert torch.allclose(wa[0], wb[0], atol=1e-6)  # probe 0 never saw what probe 1 learnt
        assert not torch.allclose(wa[1], wb[1])


def test_a_seeded_sweep_reports_every_probe_and_repeats_exactly(swept):
    features, records = swept
    tasks = ["pos", "deps", "agreement", "coref", "distance", "depth"]
    first = probe_sweep(features, records, [0, 1, 2], tasks, TINY, seed=5)
    again = probe_sweep(features, records, [0, 1, 2], tasks, TINY, seed=5)
    assert json.dumps(first) == json.dumps(again)  # NaN (no rise in cumulative scores) included
    pos = first["tasks"]["pos"]
    for head in ("linear", "mlp"):
        assert len(pos[head]["accuracy"]) == len(pos[head]["selectivity"]) == 3
        assert pos[head]["selectivity"] == pytest.approx([a - c for a, c in zip(pos[head]["accuracy"],
                                                                                   pos[head]["control"])])
    assert pos["mlp"]["accuracy"][0] > pos["majority"] + 0.2  # word identity alone gives most tags
    assert sum(pos["cumulative"]["mix_weights"]) == pytest.approx(1.0)
    assert len(first["tasks"]["distance"]["uuas"]) == 3 and \
        0 <= first["baselines"]["right_branching_uuas"] <= 1
    assert first["baselines"]["layer0"]["pos"] == pos["mlp"]["accuracy"][0]
    report = summary(first)
    assert set(report["checks"]) == {"pos_expected_layer_below_long_range",
                                     "uuas_points_above_right_branching"}


def test_a_sweep_on_chosen_layers_names_them(swept):
    features, records = swept
    result = probe_sweep(features, records, [1, 2], ["pos", "depth"], TINY, seed=0, heads=("linear",),
                         control=False)
    assert result["layers"] == [1, 2] and result["tasks"]["pos"]["linear"]["best_layer"] in (1, 2)
    assert "control" not in result["tasks"]["pos"]["linear"] and "layer0" not in result["baselines"]
    assert 1 <= result["tasks"]["pos"]["cumulative"]["center_of_gravity"] <= 2
    with pytest.raises(ValueError, match="unknown task"):
        probe_sweep(features, records, [1], ["syntax"], TINY)


def test_an_unknown_task_is_named_as_the_field_tasks(swept):
    """probe_sweep(tasks=["syntax"]) said "--tasks: ...", a flag the Python caller never gave: the field."""
    from lmforge.config.options import OptionsError

    features, records = swept
    with pytest.raises(OptionsError) as caught:
        probe_sweep(features, records, [1], ["syntax"], TINY)
    assert str(caught.value).startswith("tasks: unknown task(s) ['syntax']") and caught.value.field == "tasks"


def _layer_two_knows(n: int, seed: int) -> Examples:
    """Four layers of noise; only layer 2 carries the label (the sign of one dimension)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(4, n, 8, generator=g)
    return Examples(table, torch.arange(n)[:, None], (table[2, :, 0] > 0).long()[None])


def test_the_best_layer_is_chosen_on_dev_never_on_test():
    # train: layers 0 and 1 both carry the label; dev: only layer 0 does; test: only layer 1 does
    g = torch.Generator().manual_seed(0)

    def split(n: int, knowing: tuple) -> Examples:
        table = torch.randn(2, n, 4, generator=g)
        label = (torch.rand(n, generator=g) > 0.5).long()
        for layer in knowing:
            table[layer, :, 0] = 2 * label - 1
        return Examples(table, torch.arange(n)[:, None], torch.stack([label, label]))

    examples = {"train": split(400, (0, 1)), "dev": split(200, (0,)), "test": split(200, (1,))}
    config = FitConfig(epochs=5, lr=1e-2, batch_size=64)
    result = per_layer(examples, [3, 7], "linear", config, seed=0, task="toy")
    assert result["accuracy"][1] > result["accuracy"][0]  # test would have picked layer 7
    assert result["dev_accuracy"][0] > result["dev_accuracy"][1]
    assert result["best_layer"] == 3


def test_the_summary_reports_structural_scores_at_the_dev_chosen_layer():
    results = {"layers": [0, 1], "baselines": {"right_branching_uuas": 0.3},
               "tasks": {"distance": {"uuas": [0.5, 0.7], "dspr": [0.6, 0.9], "dev_loss": [1.0, 2.0],
                                      "best_layer": 0}}}
    assert summary(results)["distance"] == {"best_layer": 0, "uuas": 0.5, "dspr": 0.6}


def test_batched_cumulative_scoring_matches_one_probe_per_prefix():
    examples = {k: _layer_two_knows(n, s)
                for k, n, s in (("train", 600, 0), ("dev", 200, 1), ("test", 400, 2))}
    config = FitConfig(epochs=12, hidden=16, batch_size=64, lr=1e-2, mix_lr=5e-2, patience=4)
    batched = cumulative(examples, [0, 1, 2, 3], "mlp", config, seed=0, task="toy")
    alone = [mix_probe(examples, n, "mlp", config, seed=n)[0] for n in range(1, 5)]
    # the mixes of layers 0 and 0..1 know nothing; from 0..2 on they know the label, both ways
    for scores in (batched["scores"], alone):
        assert max(scores[:2]) < 0.65 and min(scores[2:]) > 0.85, scores
    assert batched["scores"] == pytest.approx(alone, abs=0.08)
    assert batched["expected_layer"] == pytest.approx(2.0, abs=0.3)
    assert sum(batched["mix_weights"]) == pytest.approx(1.0) and batched["mix_weights"][2] == max(
        batched["mix_weights"])


def test_each_prefix_mix_weighs_only_its_own_prefix():
    examples = _layer_two_knows(300, 0)
    probes = PrefixMixProbes(8, 2, 4, arity=1, head="linear")
    # uniform
    assert torch.allclose(probes.mix.weights, torch.tril(torch.ones(4, 4)) / torch.arange(1, 5)[:, None])
    fit(probes, examples, examples, FitConfig(epochs=5, batch_size=32, mix_lr=0.1), seed=0)
    weights = probes.mix.weights
    assert (weights.triu(1) == 0).all() and torch.allclose(weights.sum(1), torch.ones(4))
    assert weights[3, 2] > 0.25  # the full mix moved towards the layer that knows
    x = torch.randn(4, 5, 1, 8)
    later = x.clone()
    later[3] += 100.0  # changing layer 3 changes only the mix that contains it
    assert torch.equal(probes.mix(x)[:3], probes.mix(later)[:3]) and not torch.equal(probes.mix(x)[3],
                                                                                     probes.mix(later)[3])
