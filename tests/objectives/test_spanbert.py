import collections

import pytest
import torch
from safetensors.torch import load_file

import lmforge
from lmforge.objectives import IGNORE, SpanMLM
from lmforge.objectives.spanbert import length_distribution
from lmforge.train import Trainer
from lmforge.train.log import read_metrics

from tests.objectives.test_mlm import seed_outcomes
from tests.train.helpers import quick

MASK, CLS, SEP = 3, 1, 2


def _objective(**kw):
    torch.manual_seed(0)
    return SpanMLM(lmforge.build(lmforge.tiny("bert-base")), mask_id=MASK, special_ids=(CLS, SEP), **kw)


def _corpus(n, length, seed=0):
    """[CLS] random ids [SEP] with words of one or more pieces (70 % of the pieces start a word)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        starts = (torch.rand(length, generator=gen) < 0.7).tolist()
        starts[0] = True
        out.append({"input_ids": [CLS, *torch.randint(5, 99, (length,), generator=gen).tolist(), SEP],
                    "word_starts": [True, *starts, True]})
    return out


def _spans(out):
    """(s, e) of every span, from the per-position boundaries the corruption emits."""
    return sorted({(left + 1, right - 1) for left, right, label in
                   zip(out["span_left"], out["span_right"], out["labels"]) if label != IGNORE})


def _words(example, s, e):
    return sum(example["word_starts"][s:e + 1])


def test_length_distribution_is_the_truncated_geometric_with_the_papers_mean():
    probs = length_distribution(0.2, 10)
    assert probs.shape == (10,) and abs(float(probs.sum()) - 1) < 1e-12
    assert abs(float(probs[1] / probs[0]) - 0.8) < 1e-12
    # renormalised over 1..10: 3.797 ~ the paper's 3.8 (the tail piled onto 10 would give 4.46)
    assert abs(float((probs * torch.arange(1, 11)).sum()) - 3.797) < 1e-3


def test_selection_spans_and_per_span_80_10_10_over_100k_tokens():
    objective = _objective()
    selected = candidates = 0
    kinds = collections.Counter()
    for i, example in enumerate(_corpus(800, 126)):
        ids, starts = example["input_ids"], example["word_starts"]
        out = objective.corrupt(example, torch.Generator().manual_seed(i))
        candidates += len(ids) - 2
        selected += sum(label != IGNORE for label in out["labels"])
        for s, e in _spans(out):
            # whole words, boundaries observed, positions relative to the span start (1-based)
            assert starts[s] and starts[e + 1] and 1 <= _words(example, s, e) <= 10
            assert out["labels"][s - 1] == out["labels"][e + 1] == IGNORE
            assert out["labels"][s:e + 1] == ids[s:e + 1]
            assert out["span_pos"][s:e + 1] == list(range(1, e - s + 2))
            new = out["input_ids"][s:e + 1]
            kinds["mask" if set(new) == {MASK} else "kept" if new == ids[s:e + 1] else "random"] += 1
        unselected = [i for i, label in enumerate(out["labels"]) if label == IGNORE]
        assert [out["input_ids"][i] for i in unselected] == [ids[i] for i in unselected]
    assert candidates >= 100_000
    assert abs(selected / candidates - 0.15) < 0.005
    spans = sum(kinds.values())  # ~3000: 80/10/10 is decided per span
    assert abs(kinds["mask"] / spans - 0.8) < 0.025 and abs(kinds["kept"] / spans - 0.1) < 0.02
    assert abs(kinds["random"] / spans - 0.1) < 0.02


def test_span_lengths_follow_the_distribution_in_long_sequences():
    # the span meeting the budget is kept with probability left / size, which favours short
    # spans; with ~28 spans per 1000-token sequence that bias is small (3.77 vs 3.80)
    objective = _objective()
    lengths = []
    for i, example in enumerate(_corpus(200, 998, seed=1)):
        out = objective.corrupt(example, torch.Generator().manual_seed(i))
        lengths += [_words(example, s, e) for s, e in _spans(out)]
    counts = collections.Counter(lengths)
    assert len(lengths) > 5000  # the mean's standard error is ~0.035
    assert abs(sum(lengths) / len(lengths) - 3.8) < 0.12
    for length, p in enumerate(length_distribution().tolist(), start=1):
        assert abs(counts[length] / len(lengths) - p) < 0.015, length


def test_golden_examples():
    objective = _objective()
    ids = [CLS, *range(10, 40), SEP]
    example = {"input_ids": ids, "word_starts": [True] + [i % 3 != 1 for i in range(30)] + [True]}
    out = objective.corrupt(example, torch.Generator().manual_seed(0))
    assert out == objective.corrupt(example, torch.Generator().manual_seed(0))
    # 30 x 0.15 = 4.5 tokens: a one-word span at 9 (kept unchanged) and a two-word span
    # (1 + 2 pieces) at 28..30, replaced by [MASK], whose right boundary is [SEP]
    assert out["input_ids"] == [*ids[:28], MASK, MASK, MASK, SEP]
    assert out["labels"] == [IGNORE] * 9 + [18] + [IGNORE] * 18 + [37, 38, 39, IGNORE]
    assert out["span_left"] == [0] * 9 + [8] + [0] * 18 + [27, 27, 27, 0]
    assert out["span_right"] == [0] * 9 + [10] + [0] * 18 + [31, 31, 31, 0]
    assert out["span_pos"] == [0] * 9 + [1] + [0] * 18 + [1, 2, 3, 0]
    assert "word_starts" not in out
    random = objective.corrupt(example, torch.Generator().manual_seed(5))  # a span of random tokens
    assert random["input_ids"] == [*ids[:12], 81, *ids[13:]] and random["labels"][12] == 21
    assert (random["span_left"][12], random["span_right"][12], random["span_pos"][12]) == (11, 13, 1)


def test_sbo_reads_the_boundaries_and_the_relative_position():
    objective = _objective().eval()
    hidden = torch.randn(1, 8, objective.model.config.d_model)
    batch = {"labels": torch.tensor([[IGNORE, IGNORE, 7, 8, IGNORE, IGNORE, IGNORE, IGNORE]]),
             "span_left": torch.tensor([[0, 0, 1, 1, 0, 0, 0, 0]]),
             "span_right": torch.tensor([[0, 0, 4, 4, 0, 0, 0, 0]]),
             "span_pos": torch.tensor([[0, 0, 1, 2, 0, 0, 0, 0]])}
    table = objective.model.tokens.weight
    logits = objective.sbo(hidden[0, [1, 1]], hidden[0, [4, 4]], torch.tensor([1, 2]), table)
    target = torch.tensor([7, 8])
    loss, _ = objective.sbo_loss(hidden, batch)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, target))
    changed = hidden.clone()
    changed[0, 2:4] += 1.0  # the span's own states do not enter the SBO's prediction
    torch.testing.assert_close(objective.sbo_loss(changed, batch)[0], loss)


def test_training_lowers_the_loss_and_keeps_the_lm_head(tmp_path):
    gen = torch.Generator().manual_seed(0)
    data = []
    for _ in range(48):  # counting runs over 20 ids: a span follows from its left boundary and position
        start = int(torch.randint(0, 20, (), generator=gen))
        starts = (torch.rand(30, generator=gen) < 0.7).tolist()
        data.append({"input_ids": [CLS, *(5 + (start + k) % 20 for k in range(30)), SEP],
                     "word_starts": [True, True, *starts[1:], True]})
    objective = _objective()
    model = Trainer(objective, data, quick(steps=20, lr=5e-3), tmp_path).fit()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[-1]["loss"] < records[0]["loss"] - 1.0
    assert records[-1]["sbo_loss"] < records[0]["sbo_loss"] - 0.5
    # the SBO head is not a registry head (it needs span boundaries): it stays in the objective,
    # so the kept model carries the LM head only and the training checkpoint holds the SBO
    assert list(model.heads) == ["lm"] and list(lmforge.load(tmp_path / "final").heads) == ["lm"]
    weights = load_file(str(next((tmp_path / "checkpoints").iterdir()) / "model.safetensors"))
    assert {"sbo.W1.weight", "sbo.W2.weight", "sbo.positions.weight", "sbo.bias"} <= set(weights)


def test_bad_span_settings_are_refused():
    with pytest.raises(ValueError, match=r"^p=0.0: must be a number > 0 and <= 1$"):
        _objective(p=0.0)
    with pytest.raises(ValueError, match="max_words"):
        _objective(max_words=0)


def test_a_seed_fixes_every_draw_and_different_seeds_draw_different_spans():
    objective = _objective()
    assert len(set(seed_outcomes(objective.corrupt, _corpus(1, 60)[0]))) == 20
