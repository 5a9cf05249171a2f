import json

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.objectives import PermutationLM
from lmforge.objectives.plm import factorisation_order, permutation_masks
from lmforge.train import Trainer
from tests.objectives.test_mlm import seed_outcomes
from tests.train.helpers import quick, toy_data

CLS, SEP = 1, 2


def _objective(K=6, mem_len=0, seed=0, **overrides):
    torch.manual_seed(seed)
    model = lmforge.build(lmforge.tiny("xlnet-base"), **overrides)
    return PermutationLM(model, K=K, special_ids=(CLS, SEP), mem_len=mem_len)


def _example(length):
    return {"input_ids": [CLS, *range(10, 10 + length - 2), SEP]}


def test_golden_masks_of_a_given_order():
    # z = (1, 3, 0, 2): ranks 2, 0, 3, 1; position 2 (last in z) is the target; T = 5 pads one
    perm_mask, target_mapping = permutation_masks([[2, 0, 3, 1]], [[2]], 5)
    assert perm_mask[0].tolist() == [[1, 0, 1, 0, 1],
                                     [1, 1, 1, 1, 1],
                                     [0, 0, 1, 0, 1],
                                     [1, 0, 1, 1, 1],
                                     [1, 1, 1, 1, 1]]
    assert target_mapping.tolist() == [[[0, 0, 1, 0, 0]]]


def test_golden_seeded_corruption():
    objective = _objective(K=3)
    out = objective.corrupt(_example(8), torch.Generator().manual_seed(0))
    assert out == {"input_ids": [1, 10, 11, 12, 13, 14, 15, 2], "rank": [4, 1, 2, 5, 6, 7, 3, 0],
                   "targets": [4, 5], "labels": [13, 14]}
    # the targets are the last 6 / K = 2 of the order, and never [CLS] or [SEP]
    assert sorted(out["rank"][i] for i in out["targets"]) == [6, 7]


@pytest.mark.parametrize("lengths", [(7, 4), (8, 5), (13, 12)])
def test_mask_invariants_at_odd_and_even_lengths(lengths):
    objective = _objective(K=4)
    for seed in range(5):
        examples = [objective.corrupt(_example(n), torch.Generator().manual_seed(seed * 10 + i))
                    for i, n in enumerate(lengths)]
        batch = objective.collate(examples)
        T = batch["input_ids"].shape[1]
        for b, (e, n) in enumerate(zip(examples, lengths)):
            rank = torch.tensor(e["rank"])
            query = batch["perm_mask"][b] == 0  # (T, T): what the query stream of i may see
            content = query.clone()
            content[range(n), range(n)] = True  # the content stream adds its own position
            assert not query.diagonal().any()  # no query position sees its own content
            assert not query[:, n:].any() and not query[n:].any()  # padding never attended
            earlier = rank[None, :] < rank[:, None]  # j before i in z
            assert torch.equal(query[:n, :n], earlier)  # exactly the earlier tokens, targets or not
            assert torch.equal(content[:n, :n], earlier | torch.eye(n, dtype=torch.bool))
            targets = set(e["targets"])
            last = sorted(rank.tolist())[n - len(targets):]
            assert sorted(e["rank"][i] for i in targets) == last  # the last 1/K of z
            assert 0 not in targets and n - 1 not in targets  # [CLS] and [SEP] are context
            for i in targets:  # every non-target token is visible to every target
                assert all(query[i, j] for j in range(n) if j not in targets)
            tm = batch["target_mapping"][b]
            assert tm[: len(targets)].argmax(-1).tolist() == e["targets"] and tm[len(targets):].sum() == 0
            assert batch["labels"][b, : len(targets)].tolist() == [e["input_ids"][i] for i in e["targets"]]
        assert T == max(lengths)


def test_the_model_never_reads_a_target_or_a_later_token():
    objective = _objective(K=3).eval()
    e = objective.corrupt(_example(11), torch.Generator().manual_seed(3))
    batch = objective.collate([e])
    model = objective.model

    def query_outputs(ids):
        with torch.no_grad():
            return model(ids, batch["attention_mask"], perm_mask=batch["perm_mask"],
                         target_mapping=batch["target_mapping"], run_heads=False).last_hidden_state[0]

    base = query_outputs(batch["input_ids"])
    first, second = e["targets"][0], e["targets"][1]  # second comes after first in z
    changed = batch["input_ids"].clone()
    changed[0, first] = 99 - changed[0, first]
    after = query_outputs(changed)
    torch.testing.assert_close(after[0], base[0], atol=0, rtol=0)  # its own token is never seen
    assert (after[1] - base[1]).abs().max() > 1e-4  # the later target does see it
    changed = batch["input_ids"].clone()
    changed[0, second] = 99 - changed[0, second]
    torch.testing.assert_close(query_outputs(changed)[0], base[0], atol=0, rtol=0)


def test_target_rate_is_one_over_K_over_many_tokens():
    objective = _objective(K=6)
    gen = torch.Generator().manual_seed(0)
    candidates = targets = 0
    while candidates < 100_000:
        e = objective.corrupt(_example(int(torch.randint(5, 130, (), generator=gen))), gen)
        candidates += len(e["input_ids"]) - 2
        targets += len(e["targets"])
    assert abs(targets / candidates - 1 / 6) < 0.003


def test_factorisation_order_is_uniform_over_positions():
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)  # how often each position is predicted last
    for _ in range(4000):
        rank, targets = factorisation_order(4, [0, 1, 2, 3], 1, gen)
        counts[targets[0]] += 1
        assert sorted(rank) == [0, 1, 2, 3] and rank[targets[0]] == 3
    assert (counts / 4000 - 0.25).abs().max() < 0.03


def test_memory_segment_is_split_off_and_left_padded():
    objective = _objective(K=3, mem_len=4)
    examples = [objective.corrupt(_example(n), torch.Generator().manual_seed(n)) for n in (12, 5)]
    assert examples[0]["memory_ids"] == [1, 10, 11, 12] and examples[1]["memory_ids"] == [1, 10]
    batch = objective.collate(examples)
    assert batch["memory_ids"].tolist() == [[1, 10, 11, 12], [0, 0, 1, 10]]
    assert batch["memory_mask"].tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert batch["input_ids"].shape == (2, 8) and batch["perm_mask"].shape == (2, 8, 8)
    loss = objective(batch).loss
    loss.backward()
    assert torch.isfinite(loss) and objective.model.embed.query_init.grad.abs().sum() > 0


@pytest.mark.parametrize("mem_len", [0, 6])
def test_loss_falls_and_the_lm_head_is_kept(tmp_path, mem_len):
    objective = _objective(K=2, mem_len=mem_len, dropout=0.0, attention_dropout=0.0)
    model = Trainer(objective, toy_data(), quick(steps=16, lr=1e-2, batch_size=8), tmp_path).fit()
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.1
    assert list(model.heads) == ["lm"]


def test_refuses_a_model_without_two_stream_attention():
    with pytest.raises(ValueError, match="xl-relative"):
        PermutationLM(lmforge.build(lmforge.tiny("bert-base")))
    with pytest.raises(ValueError, match="K"):
        _objective(K=1)


@pytest.mark.usefixtures("few_probes")  # tests/conftest.py
def test_pretrain_plm_on_the_builtin_corpus(tmp_path, capsys):
    args = ["pretrain", "--preset", "xlnet-base", "--objective", "plm", "--out", str(tmp_path),
            "--steps", "2", "batch_size=2", "progress=false", "n_layers=1", "d_model=32", "n_heads=2",
            "d_ff=64", "max_seq_len=64"]
    assert main(args) == 0
    model = lmforge.load(tmp_path / "final")
    assert set(model.heads) == {"lm"} and model.config.position == "xl-relative"
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "plm",
                 "--out", str(tmp_path / "x")]) == 2
    assert "plm" in capsys.readouterr().err


def test_a_seed_fixes_every_draw_and_different_seeds_draw_different_orders():
    objective = _objective(mem_len=0)
    assert len(set(seed_outcomes(objective.corrupt, _example(40)))) == 20
