import collections
import random

import pytest
import torch

import lmforge
from lmforge.data.examples import SSO_NEXT, SSO_PREVIOUS, SSO_RANDOM, sso_pairs
from lmforge.objectives import IGNORE, StructuralMLM
from lmforge.train import Trainer
from lmforge.train.log import read_metrics

from tests.objectives.test_mlm import seed_outcomes
from tests.train.helpers import quick

MASK, CLS, SEP = 3, 1, 2


def _objective(**kw):
    torch.manual_seed(0)
    return StructuralMLM(lmforge.build(lmforge.tiny("bert-base")), mask_id=MASK, special_ids=(CLS, SEP), **kw)


def _corpus(n=800, length=126, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [{"input_ids": [CLS, *torch.randint(5, 99, (length,), generator=gen).tolist(), SEP]}
            for _ in range(n)]


def _windows(wso_labels):
    """Shuffled positions as consecutive trigrams (adjacent windows split from the run's start)."""
    moved = [i for i, label in enumerate(wso_labels) if label != IGNORE]
    assert len(moved) % 3 == 0
    windows = [moved[j:j + 3] for j in range(0, len(moved), 3)]
    assert all(w[2] - w[0] == 2 for w in windows)
    return windows


def test_wso_permutes_exactly_trigrams_of_unmasked_tokens_over_100k_tokens():
    objective = _objective(sso=False)
    selected = moved = unmasked = candidates = 0
    for i, example in enumerate(_corpus()):
        ids = example["input_ids"]
        out = objective.corrupt(example, torch.Generator().manual_seed(i))
        windows = _windows(out["wso_labels"])
        for w in windows:
            original, new = [ids[j] for j in w], [out["input_ids"][j] for j in w]
            assert [out["wso_labels"][j] for j in w] == original
            assert all(out["labels"][j] == IGNORE and ids[j] not in (CLS, SEP) for j in w)  # unmasked only
            assert sorted(new) == sorted(original)
            assert new != original or len(set(original)) < 3  # never the identity
        inside = {j for w in windows for j in w}
        untouched = [j for j, label in enumerate(out["labels"]) if label == IGNORE and j not in inside]
        assert [out["input_ids"][j] for j in untouched] == [ids[j] for j in untouched]  # nothing else changes
        n_selected = sum(label != IGNORE for label in out["labels"])
        candidates += len(ids) - 2
        selected += n_selected
        unmasked += len(ids) - 2 - n_selected
        moved += len(inside)
    assert candidates >= 100_000
    assert abs(selected / candidates - 0.15) < 0.005  # BERT's masking is unchanged
    # 5 % of the trigrams of unmasked tokens: 5 % of the unmasked tokens move
    assert abs(moved / unmasked - 0.05) < 0.003


def test_golden_example():
    objective = _objective(sso=False, wso_rate=0.3)
    ids = [CLS, *range(10, 34), SEP]
    out = objective.corrupt({"input_ids": ids}, torch.Generator().manual_seed(0))
    assert out == objective.corrupt({"input_ids": ids}, torch.Generator().manual_seed(0))
    # masked LM at 5, 6 ([MASK]), 16 (kept) and 17 ([MASK]); trigrams 11-13 and 21-23 shuffled
    assert out["input_ids"] == [1, 10, 11, 12, 13, 3, 3, 16, 17, 18, 19, 22, 20, 21, 23, 24, 25, 3, 27, 28,
                                29, 30, 32, 31, 33, 2]
    assert out["labels"] == [IGNORE] * 5 + [14, 15] + [IGNORE] * 9 + [25, 26] + [IGNORE] * 8
    assert out["wso_labels"] == [IGNORE] * 11 + [20, 21, 22] + [IGNORE] * 7 + [30, 31, 32] + [IGNORE] * 2


def test_wso_loss_is_the_cross_entropy_at_the_shuffled_positions_and_zero_without_any():
    objective = _objective(sso=False).eval()
    hidden = torch.randn(2, 5, objective.model.config.d_model)
    labels = torch.tensor([[IGNORE, 7, 8, 9, IGNORE], [IGNORE] * 5])
    loss, _ = objective.wso_loss(hidden, labels)
    expected = torch.nn.functional.cross_entropy(objective.lm(hidden[0, 1:4]), labels[0, 1:4])
    torch.testing.assert_close(loss, expected)
    none, _ = objective.wso_loss(hidden, torch.full((2, 5), IGNORE))
    assert float(none.detach()) == 0.0


def _numbered_docs(n, seed=0):
    """Documents of increasing ids (d + 1) * 1000 + k: order and origin readable from any token."""
    rng = random.Random(seed)
    docs = []
    for d in range(n):
        k, doc = 0, []
        for _ in range(rng.randint(3, 12)):
            length = rng.randint(2, 8)
            doc.append([(d + 1) * 1000 + k + j for j in range(length)])
            k += length
        docs.append(doc)
    return docs


def _segments(pair):
    ids, sep = pair["input_ids"], pair["input_ids"].index(SEP)
    return ids[1:sep], ids[sep + 1:-1]


def test_sso_pairs_are_a_third_each_and_mean_what_they_say():
    pairs = sso_pairs(_numbered_docs(7000), cls=CLS, sep=SEP, max_len=32, seed=0)
    assert len(pairs) >= 10_000
    counts = collections.Counter(p["pair_label"] for p in pairs)
    for label in (SSO_NEXT, SSO_PREVIOUS, SSO_RANDOM):
        assert abs(counts[label] / len(pairs) - 1 / 3) < 0.02
    for pair in pairs:
        s1, s2 = _segments(pair)
        assert s1 and s2 and len(pair["input_ids"]) <= 32
        assert pair["segment_ids"] == [0] * (len(s1) + 2) + [1] * (len(s2) + 1)
        same = s1[0] // 1000 == s2[0] // 1000
        if pair["pair_label"] == SSO_NEXT:  # S2 follows S1 in the same document
            assert same and s1[-1] < s2[0]
        elif pair["pair_label"] == SSO_PREVIOUS:  # S2 precedes S1
            assert same and s2[-1] < s1[0]
        else:
            assert not same
    single = sso_pairs(_numbered_docs(1), cls=CLS, sep=SEP)  # no other document: no random class
    assert {p["pair_label"] for p in single} <= {SSO_NEXT, SSO_PREVIOUS}


def _counting_docs(n=60, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):  # each document counts upward over 20 ids, so order and continuity are learnable
        t, doc = rng.randint(0, 19), []
        for _ in range(rng.randint(2, 5)):
            length = rng.randint(4, 8)
            doc.append([5 + (t + k) % 20 for k in range(length)])
            t += length
        out.append(doc)
    return out


def test_training_lowers_the_loss_and_keeps_lm_and_sso_heads(tmp_path):
    data = sso_pairs(_counting_docs(), cls=CLS, sep=SEP, max_len=32, seed=0)
    objective = _objective(wso_rate=0.2)
    batch = objective.collate([objective.corrupt(e, torch.Generator().manual_seed(i))
                               for i, e in enumerate(data[:4])])
    assert batch["wso_labels"].shape == batch["input_ids"].shape and batch["pair_label"].shape == (4,)
    model = Trainer(objective, data, quick(steps=20, lr=5e-3), tmp_path).fit()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[-1]["loss"] < records[0]["loss"] - 1.0
    assert {"mlm_loss", "wso_loss", "sso_loss", "sso_accuracy"} <= set(records[0])
    assert sorted(model.heads) == ["lm", "sso"] and model.heads["sso"].classifier.out_features == 3
    again = lmforge.load(tmp_path / "final").eval()
    with torch.no_grad():
        ours = model.eval()(batch["input_ids"], batch["attention_mask"], segment_ids=batch["segment_ids"])
        theirs = again(batch["input_ids"], batch["attention_mask"], segment_ids=batch["segment_ids"])
    torch.testing.assert_close(ours.head_outputs["sso"], theirs.head_outputs["sso"])


def test_bad_wso_rate_and_missing_pairs_are_refused():
    with pytest.raises(ValueError, match="wso_rate"):
        _objective(wso_rate=1.0)
    objective = _objective()
    batch = objective.collate([objective.corrupt(e, torch.Generator().manual_seed(0))
                               for e in _corpus(2, 10)])
    with pytest.raises(ValueError, match="sso=False"):
        objective(batch)


def test_a_seed_fixes_every_draw_and_different_seeds_shuffle_differently():
    objective = _objective(sso=False, wso_rate=0.5)
    outcomes = seed_outcomes(objective.corrupt, _corpus(1, 60)[0])
    assert len(set(outcomes)) == 20
    # the shuffles alone (the same masking, another trigram draw) differ too
    wso = {repr(objective.corrupt(_corpus(1, 60)[0], torch.Generator().manual_seed(s))["wso_labels"])
           for s in range(20)}
    assert len(wso) == 20
