"""Unstructured pruning: Zhu & Gupta's cubic schedule, magnitude masks, movement scores and their
straight-through gradient, soft movement's global threshold and L1 penalty, the exact final
sparsity, baked masks that reload, `lmforge prune --method magnitude|movement|soft-movement`."""
import itertools
import json

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import lmforge
from lmforge.cli import main
from lmforge.compress.sparsity import (FLOOR, MovementMask, Pruner, cubic_sparsity, floor, fused_rows,
                                       is_score, kept, prunable, top_k_mask, weight_sparsity)
from lmforge.config.options import OptionsError
from lmforge.io import CheckpointError
from lmforge.train.optim import build_optimizer, param_groups
from tests.conftest import tiny_model
from tests.tasks.core import sentiment, tiny, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: no waiting on a busy second core


def test_cubic_schedule_values():
    # s_t = s_f + (s_i - s_f) (1 - (t - t0) / (t1 - t0))^3, t0 = 10, t1 = 110
    assert cubic_sparsity(0, 0.9, 10, 110) == 0.0 and cubic_sparsity(10, 0.9, 10, 110) == 0.0
    assert cubic_sparsity(60, 0.9, 10, 110) == pytest.approx(0.9 - 0.9 * 0.5 ** 3)  # 0.7875
    assert cubic_sparsity(35, 0.9, 10, 110) == pytest.approx(0.9 - 0.9 * 0.75 ** 3)
    assert cubic_sparsity(110, 0.9, 10, 110) == 0.9 and cubic_sparsity(500, 0.9, 10, 110) == 0.9
    values = [cubic_sparsity(t, 0.97, 0, 50, initial=0.1) for t in range(51)]
    assert values[0] == 0.1 and all(a < b for a, b in itertools.pairwise(values))


def test_magnitude_keeps_the_largest_weights_and_pruned_ones_stay_out():
    model = tiny_model("bert-base")
    pruner = Pruner(model, "magnitude", 0.5, 0, 10)
    linear, mask = next((lin, m) for lin, m in pruner.masks() if m.rows == [lin.out_features])  # unfused
    w = linear.parametrizations.weight.original
    pruner.at(5)  # the schedule's sparsity at step 5 of 0..10
    s = cubic_sparsity(5, 0.5, 0, 10)
    k = kept(w.numel(), s)
    assert int(mask.mask.sum()) == k
    threshold = w.abs().flatten().topk(k).values[-1]
    assert bool((w.abs()[mask.mask.bool()] >= threshold).all())
    assert bool((w.abs()[~mask.mask.bool()] <= threshold).all())
    assert torch.equal(linear.weight, w * mask.mask)  # the forward sees the masked weight
    out = ~mask.mask.bool()
    with torch.no_grad():
        w[out] = 100.0  # a pruned weight that grows is not brought back (Zhu & Gupta: it is zero)
    pruner.at(10)
    assert not bool(mask.mask.bool()[out].any()) and int(mask.mask.sum()) == kept(w.numel(), 0.5)


@pytest.mark.parametrize("method", ["magnitude", "movement"])
def test_a_fused_qkv_is_pruned_as_q_k_and_v_each_at_the_sparsity(method):
    # Zhu & Gupta and Sanh et al. rank each weight matrix on its own (the reference's BERT has q, k and v
    # apart): q's larger weights (or scores) must not take k's and v's share of the fused projection
    model = tiny_model("bert-base")
    attn = model.encoder.blocks[0].attn
    with torch.no_grad():
        attn.qkv.weight[: attn.qkv.out_features // 3] *= 10
    pruner = Pruner(model, method, 0.5, 0, 1)
    if method == "movement":
        for linear, mask in pruner.masks():
            mask.scores.data = linear.parametrizations.weight.original.detach().abs()
    pruner.at(1)
    for part in attn.qkv.weight.split(attn.qkv.out_features // 3):  # q, k, v
        assert int(part.ne(0).sum()) == kept(part.numel(), 0.5)
        threshold = part.abs().flatten().topk(kept(part.numel(), 0.5)).values[-1]
        assert bool((part.abs()[part.ne(0)] >= threshold).all())  # each keeps its own largest


def test_movement_scores_accumulate_minus_w_times_grad_through_the_straight_through_mask():
    torch.manual_seed(0)
    linear = nn.Linear(3, 2, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]]))
    w = linear.weight.detach().clone()
    parametrize.register_parametrization(linear, "weight", MovementMask(linear.weight))
    mask = linear.parametrizations.weight[0]
    mask.sparsity.fill_(0.5)  # 3 of 6 kept: the straight-through gradient still reaches all 6 scores
    opt = torch.optim.SGD([mask.scores], lr=1.0)  # W stays fixed: S sums -W * grad exactly
    expected = torch.zeros_like(w)
    for x, c in ((torch.tensor([[1.0, 2.0, -1.0]]), torch.tensor([[1.0, -1.0]])),
                 (torch.tensor([[0.5, -1.0, 3.0]]), torch.tensor([[2.0, 0.5]]))):
        opt.zero_grad()
        linear.parametrizations.weight.original.grad = None
        loss = (linear(x) * c).sum()  # dL/dW' = c^T x
        loss.backward()
        grad_w = c.T @ x
        torch.testing.assert_close(mask.scores.grad, grad_w * w)  # dL/dS = dL/dW' * W, for every entry
        masked = linear.parametrizations.weight.original.grad
        on = mask.scores.detach().flatten().topk(3).indices
        assert torch.count_nonzero(masked) <= 3 and torch.equal(masked.flatten()[on], grad_w.flatten()[on])
        opt.step()
        expected -= grad_w * w
    torch.testing.assert_close(mask.scores.detach(), expected)  # S = -sum_t (dL/dW')_t W


@pytest.mark.parametrize("method", ["magnitude", "movement", "soft-movement"])
def test_final_sparsity_is_the_target_and_the_baked_model_reloads(tmp_path, method):
    model = tiny_model("bert-base").eval()
    pruner = Pruner(model, method, 0.75, 0, 4)
    if method != "magnitude":  # distinct scores: a top-k of ties would be arbitrary but as exact
        for _, mask in pruner.masks():
            mask.scores.data.normal_()
    assert pruner.at(4) == 0.75
    ids = torch.randint(5, 99, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        masked = model(ids).last_hidden_state
    pruner.bake()
    assert not any(parametrize.is_parametrized(m) for m in prunable(model).values())
    counts = weight_sparsity(model)
    if method == "soft-movement":  # one threshold for all: the total is exact, not each matrix's share
        assert counts["weights"] - counts["zeros"] == kept(counts["weights"], 0.75)
    else:
        parts = [r * m.in_features for name, m in prunable(model).items() for r in fused_rows(model, name, m)]
        assert counts["zeros"] == sum(n - kept(n, 0.75) for n in parts)  # each of q, k, v exact
    assert abs(counts["sparsity"] - 0.75) < 1e-3
    model.save(tmp_path)
    again = lmforge.load(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(again(ids).last_hidden_state, masked)
    assert weight_sparsity(again) == counts
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a truncated copy is refused
    with pytest.raises(CheckpointError):
        lmforge.load(tmp_path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny pretrained BERT directory (no task head) and sentiment train / dev files."""
    root = tmp_path_factory.mktemp("sparse")
    model = tiny("bert-base", n_layers=2, n_heads=4)
    model.save(root / "bert")
    tokenizer().save(root / "bert")
    data = sentiment(200)
    for split in ("train", "validation"):
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data[split][:64]))
    return root


@pytest.mark.parametrize("method", ["magnitude", "movement", "soft-movement"])
def test_prune_command_fine_tunes_while_pruning(files, tmp_path, capsys, method):
    out = tmp_path / method
    argv = ["prune", "--model", str(files / "bert"), "--task", "cls", "--method", method, "--sparsity", "0.8",
            "--train", str(files / "train.jsonl"), "--valid", str(files / "validation.jsonl"),
            "--data", str(files / "validation.jsonl"), "--steps", "6", "--out", str(out), "progress=false",
            "batch_size=8", "lr=1e-3", "eval_every=3"]
    assert main(argv) == 0
    report = json.loads((out / "prune.json").read_text())
    assert report["seed"] == 0  # the run's seed, said in the report a reader opens
    # soft movement: matrices kept at their floor (few steps: few distinct scores) add to the share kept
    low = 0.8 - (FLOOR if method == "soft-movement" else 0) - 1e-3
    assert low <= report["weight_sparsity"]["sparsity"] <= 0.8 + 1e-3
    # the source (no task head) is measured as the run began: size and time, not a fresh head's metric
    before, after = report["before"], report["after"]
    assert before["metric"] is None and "not fine-tuned" in before["metric_note"] and after["metric"] >= 0
    assert before["parameters"] == after["parameters"] and before["bytes"] > 0 and after["bytes"] > 0
    assert report["speedup"] == before["seconds_b16"] / after["seconds_b16"]
    assert report["achieved_sparsity"] == report["weight_sparsity"]["sparsity"]
    assert report["metric_name"] == after["metric_name"] == "accuracy"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["sparsity"] == pytest.approx(0.8) and "valid_accuracy" in rows[-1]
    assert [r["sparsity"] for r in rows] == sorted(r["sparsity"] for r in rows)
    if method == "soft-movement":  # the L1 penalty reaches the loss once pruning has begun
        assert any(r.get("l1_penalty", 0) > 0 and r["loss"] > r["task_loss"] for r in rows)
    final = lmforge.load(out / "final")
    assert weight_sparsity(final) == report["weight_sparsity"]
    sizes = {name: linear.weight.numel() for name, linear in prunable(final).items()}
    kept_weights = sum(share * sizes[name] for name, share in report["kept_by_matrix"].items())
    share = kept_weights / sum(sizes.values())
    assert share == pytest.approx(1 - report["weight_sparsity"]["sparsity"], abs=1e-3)
    printed = capsys.readouterr().out
    assert "no speed-up" in printed and "before: not fine-tuned for cls" in printed
    assert f"{report['speedup']:.2f}x" in printed
    assert f"0.8 asked, {report['achieved_sparsity']:.4f}" in printed


def test_prune_command_refuses_bad_input(files, tmp_path, capsys):
    base = ["prune", "--model", str(files / "bert"), "--task", "cls",
            "--data", str(files / "validation.jsonl"), "--out", str(tmp_path / "x")]
    assert main(base + ["--method", "movement", "--sparsity", "0.5"]) == 2  # no --train
    assert "--train" in capsys.readouterr().err
    train = ["--train", str(files / "train.jsonl"), "--steps", "2"]
    assert main(base + ["--method", "movement", "--sparsity", "1.5", *train]) == 2
    assert "sparsity" in capsys.readouterr().err
    assert main(base + ["--method", "magnitude", "--sparsity", "0.5", *train, "start=0.9", "end=0.2"]) == 2
    assert main(base + ["--method", "magnitude", "--sparsity", "0.5", *train, "bogus=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "bogus" in err[-1]
    assert main(base + ["--method", "soft-movement", "--sparsity", "0.5", *train, "parallel=fsdp"]) == 2
    assert "parallel=fsdp" in capsys.readouterr().err  # FSDP shards the matrices a top-k ranks
    assert main(base + ["--method", "magnitude", "--sparsity", "0.0002", *train]) == 2
    assert "error: --sparsity 0.0002 removes no weight" in capsys.readouterr().err  # the flag, as before


@pytest.mark.parametrize("method", ["magnitude", "movement", "soft-movement"])
def test_int8_models_and_sparsities_that_remove_nothing_are_refused(method):
    from lmforge.compress.quantize import quantize

    with pytest.raises(ValueError, match="int8-quantised .*prune the fp32 model"):
        Pruner(quantize(tiny_model("bert-base"), alpha=None), method, 0.5, 0, 4)
    model = tiny_model("bert-base")
    # each of q, k, v is a matrix of its own; soft movement ranks all weights at once
    sizes = [r * m.in_features for name, m in prunable(model).items() for r in fused_rows(model, name, m)]
    pool = sum(sizes) if method == "soft-movement" else max(sizes)
    with pytest.raises(OptionsError, match=r"^sparsity \S+ removes no weight") as refused:  # not --sparsity
        Pruner(model, method, 0.4 / pool, 0, 4)
    assert refused.value.field == "sparsity"
    smallest = float(str(refused.value).rsplit(" ", 1)[-1])  # "... the smallest sparsity ... is X"
    assert not any(parametrize.is_parametrized(m) for m in prunable(model).values())
    # the least of 4 decimals that removes one
    assert kept(pool, smallest) < pool and kept(pool, round(smallest - 1e-4, 4)) == pool
    Pruner(model, method, smallest, 0, 4)


def test_movement_masks_do_not_depend_on_the_scores_lr_from_constant_scores():
    # from S = 0, AdamW (no decay on S) moves S by lr x a direction that does not depend on lr:
    # S scales with the scores' lr and top-k, hence the mask and the weights' path, does not
    def train(scores_lr: float) -> tuple:
        torch.manual_seed(0)
        linear = nn.Linear(8, 6)
        parametrize.register_parametrization(linear, "weight", MovementMask(linear.weight))
        mask = linear.parametrizations.weight[0]
        opt = torch.optim.AdamW([{"params": [mask.scores], "lr": scores_lr, "weight_decay": 0.0},
                                 {"params": [linear.parametrizations.weight.original, linear.bias]}],
                                lr=1e-2, eps=1e-12, foreach=False)
        masks = []
        for step in range(12):
            mask.sparsity.fill_(cubic_sparsity(step, 0.75, 2, 10))
            x = torch.randn(16, 8)
            loss = ((linear(x) - x[:, :6].flip(1)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            masks.append(linear.weight.detach().ne(0))
        return mask.scores.detach(), masks, linear.parametrizations.weight.original.detach()

    small, big = train(1e-2), train(1e-1)
    torch.testing.assert_close(big[0], 10 * small[0], rtol=1e-4, atol=1e-7)
    assert all(torch.equal(a, b) for a, b in zip(small[1], big[1])) and \
        int(small[1][-1].sum()) == kept(48, 0.75)
    torch.testing.assert_close(big[2], small[2])


def soft_pruned(sparsity: float = 0.9, soft_lambda: float = 0.0) -> tuple:
    """A tiny BERT under soft movement with distinct scores, larger in the first matrix."""
    torch.manual_seed(0)
    model = tiny_model("bert-base")
    pruner = Pruner(model, "soft-movement", sparsity, 0, 2, soft_lambda)
    for i, (_, mask) in enumerate(pruner.masks()):
        mask.scores.data.normal_().add_(2.0 if i == 0 else 0.0)
    return model, pruner


def test_soft_movement_keeps_the_global_top_share_and_each_matrix_finds_its_own():
    _, pruner = soft_pruned()
    pruner.at(2)
    masks = pruner.masks()
    scores = torch.cat([mask.scores.detach().flatten() for _, mask in masks])
    on = [linear.weight.detach().ne(0) for linear, _ in masks]
    assert sum(int(m.sum()) for m in on) == kept(scores.numel(), 0.9)
    tau = scores.topk(kept(scores.numel(), 0.9)).values[-1]  # the k-th largest of all the scores
    assert all(bool((mask.scores[o] >= tau).all()) and bool((mask.scores[~o] <= tau).all())
               for (_, mask), o in zip(masks, on))
    shares = [float(o.float().mean()) for o in on]
    assert shares[0] > 0.4 and min(shares) < 0.1  # the first matrix's higher scores keep 4x the mean share
    assert all(int(o.sum()) >= max(1, FLOOR * o.numel()) for o in on)  # the floor: no matrix emptied


def test_soft_movement_keeps_the_floor_of_q_k_and_v_each():
    # the reference's q, k and v are matrices of their own, each kept at >= 0.5 % (its min_elements)
    model = tiny_model("bert-base")
    pruner = Pruner(model, "soft-movement", 0.9, 0, 1)
    for linear, mask in pruner.masks():
        mask.scores.data.normal_()
    attn = model.encoder.blocks[0].attn
    mask = attn.qkv.parametrizations.weight[0]
    third = attn.qkv.out_features // 3
    mask.scores.data[:third] = -100.0  # q's scores below every other: the global top-k leaves it nothing
    pruner.at(1)
    q, k, v = attn.qkv.weight.detach().split(third)
    assert int(q.ne(0).sum()) == floor(q.numel())  # q at its own floor, not left empty beside k and v
    assert all(int(p.ne(0).sum()) >= floor(p.numel()) for p in (k, v))


def test_soft_movement_scores_learn_before_the_first_cut():
    model = tiny_model("bert-base")
    pruner = Pruner(model, "soft-movement", 0.9, 5, 10)
    assert pruner.at(3) == 0  # the initial warm-up: nothing pruned, the scores already move
    ids = torch.randint(5, 99, (2, 9), generator=torch.Generator().manual_seed(0))
    model(ids).last_hidden_state.pow(2).mean().backward()
    for linear, mask in pruner.masks():
        w = linear.parametrizations.weight.original
        assert torch.equal(linear.weight, w) and mask.scores.grad is not None
        torch.testing.assert_close(mask.scores.grad, w.grad * w)  # dL/dS = dL/dW' * W with M = 1


def test_soft_movement_masks_follow_the_scores_past_the_schedule_and_into_the_baked_model():
    model, pruner = soft_pruned()
    groups = param_groups(model, 0.01, 1.0, lambda name, p: 100.0 if is_score(name) else 1.0)
    scores = [p for g in groups if g["weight_decay"] == 0.0 and g["lr"] == 100.0 for p in g["params"]]
    assert len(scores) == len(pruner.masks())  # the scores are never decayed (as the reference's)
    # the trainer's optimiser: fused AdamW, whose step leaves the parameters' version counters alone
    optimizer = build_optimizer(model, 1e-3, 0.01, lr_scale=lambda name, p: 100.0 if is_score(name) else 1.0)
    ids = torch.randint(5, 99, (2, 9), generator=torch.Generator().manual_seed(0))
    total = sum(mask.scores.numel() for _, mask in pruner.masks())

    def global_top_k() -> list:  # the masks from the scores as they are, each matrix at least its floor
        masks = [m for _, m in pruner.masks()]
        on = top_k_mask(torch.cat([m.scores.detach().flatten() for m in masks]), kept(total, 0.9))
        parts = [p.view_as(m.scores) for m, p in zip(masks, on.split([m.scores.numel() for m in masks]))]
        return [m.floored(p) for m, p in zip(masks, parts)]

    changed = 0
    for step in range(2, 8):  # the schedule ends at step 2: the masks must go on following the scores
        model.train()
        pruner.at(step)
        model(ids).last_hidden_state.pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        before = [mask.mask for _, mask in pruner.masks()]
        model.eval()
        with torch.no_grad():
            model(ids)  # validation between steps: the masks re-chosen from the stepped scores
        expected = global_top_k()
        assert all(torch.equal(mask.mask, e) for (_, mask), e in zip(pruner.masks(), expected))
        changed += any(not torch.equal(a, m.mask) for a, (_, m) in zip(before, pruner.masks()))
    assert changed >= 3  # at the final sparsity the masks still move with the scores
    expected = global_top_k()
    pruner.bake()
    assert all(torch.equal(linear.weight.ne(0), e.bool())
               for linear, e in zip(prunable(model).values(), expected))


def test_soft_movement_penalty_is_lambda_times_mean_sigmoid_ramped_with_the_schedule():
    _, pruner = soft_pruned(0.8, soft_lambda=400.0)
    assert Pruner(tiny_model("bert-base"), "movement", 0.8, 0, 2, 400.0).penalty() is None
    names = list(pruner.linears)
    assert names[0].endswith("attn.qkv") and names[1].endswith("attn.out")
    masks = [mask for _, mask in pruner.masks()]
    d = masks[1].scores.shape[0]  # tiny BERT: q, k, v each d x d, fused in qkv
    parts = [p for m in masks for p in (m.scores.split(d) if m is masks[0] or m.scores.shape[0] == 3 * d
                                         else [m.scores])]
    pruner.at(1)  # halfway: s_1 = 0.8 - 0.8 * 0.5^3 = 0.7
    expected = 400.0 * (0.7 / 0.8) * torch.stack([torch.sigmoid(p).mean() for p in parts]).mean()
    penalty = pruner.penalty()
    torch.testing.assert_close(penalty, expected)
    penalty.backward()
    for m in masks[:2]:  # each of q, k, v weighs as much as the output projection (the reference's BERT)
        s = m.scores.detach()
        grad = 400.0 * (0.7 / 0.8) * torch.sigmoid(s) * (1 - torch.sigmoid(s)) / (d * d * len(parts))
        torch.testing.assert_close(m.scores.grad, grad)  # every score pulled down, hardest near 0


def test_fused_rows_name_the_matrices_a_projection_fuses():
    model = tiny_model("llama-3.2-1b")  # grouped-query attention: fewer key/value heads than queries
    attn = model.decoder.blocks[0].attn
    q, kv = attn.n_heads * attn.dh, attn.n_kv * attn.dh
    assert kv < q
    rows = {name: fused_rows(model, name, linear) for name, linear in prunable(model).items()}
    assert rows["decoder.blocks.0.attn.qkv"] == [q, kv, kv]
    assert all(r == [linear.out_features] for (name, linear), r in zip(prunable(model).items(), rows.values())
               if not name.endswith(".qkv"))
    t5 = tiny_model("t5-small")  # cross-attention: its kv fuses k and v
    cross = {n: fused_rows(t5, n, m) for n, m in prunable(t5).items() if n.endswith(".kv")}
    assert cross and all(len(r) == 2 and r[0] == r[1] for r in cross.values())
    longformer = tiny_model("longformer-base")  # its global q, k, v are three matrices too (query_global)
    glob = {n: fused_rows(longformer, n, m) for n, m in prunable(longformer).items()
            if n.endswith("global_qkv")}
    assert glob and all(r == [m.out_features // 3] * 3 for r, m in
                        zip(glob.values(), (longformer.get_submodule(n) for n in glob)))
