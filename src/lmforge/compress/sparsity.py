"""Unstructured pruning of the encoder's Linear weights during fine-tuning: magnitude and movement.

- The schedule (Zhu & Gupta 2017, eq. 1): the sparsity rises from s_i to s_f as
  s_t = s_f + (s_i - s_f) (1 - (t - t_0) / (t_1 - t_0))^3 between steps t_0 and t_1: fast at
  first, while the network is redundant, then slowly; 0 before t_0 and s_f after t_1 (Sanh et
  al. 2020's initial and final warm-up).
- Magnitude pruning (Zhu & Gupta 2017): each matrix keeps its largest |W|; a fused projection
  (attention's qkv, cross kv) is the matrices it fuses, each ranked on its own, as the
  reference's separate q, k and v (`fused_rows`). A pruned weight
  stays pruned (it is zero in their method, so it never returns): the mask is re-ranked on
  |W| x mask as the sparsity rises.
- Movement pruning (Sanh, Wolf & Rush 2020, sec. 4): importance scores S of the shape of W; the
  mask keeps each matrix's top-k scores (q, k and v apart), W' = W * TopK(S). The mask's gradient passes
  straight through to S, so dL/dS = dL/dW' * W and gradient descent accumulates
  S = -lr sum_t (dL/dW')_t W_t: weights moving away from zero gain importance.
  The scores train with their own (larger) learning rate, as the reference code's
  mask_scores_learning_rate. Under AdamW (the reference's optimiser, and the trainer's) a score
  moves by at most about its lr per step, along -(dL/dW') W's running mean over its RMS: |W|
  cancels (but for eps), so S ranks how consistently a weight moved away from zero, and from
  S = 0 (the reference's constant init) the scores' lr only scales S, leaving every top-k mask
  as it is: it is no lever on which weights go. Scores learned over few noisy batches rank the
  weights nearly at random (worse: large ones that happened to move towards zero go first), so
  the first cut must wait for them (the initial warm-up: one epoch in the reference). Unlike
  the reference, scores are not decayed (they carry `no_weight_decay`, see train/optim).
- Soft movement pruning (Sanh et al. 2020, sec. 4, "soft"): the mask is 1[S > tau] with one
  threshold for the whole model, so each matrix finds its own sparsity, and an L1 penalty
  lambda x mean sigmoid(S) (the reference's: a mean per matrix, then over matrices, q, k and v
  counted apart as in its BERT though lmforge fuses them) pulls down the
  scores of weights whose movement is weaker than it: under AdamW that is no longer a change of
  scale alone, unlike the scores' lr. The reference fixes tau and lets lambda set the sparsity
  it ends at; here tau is set at each step to the global score that keeps the schedule's share
  (a global top-k), so runs compare at the same sparsity, and lambda ramps with it
  (lambda x s_t / s_f, as the reference ramps it with its threshold). Each matrix (q, k and v
  apart) keeps at least 0.5 % of its weights (the reference's floor), its largest scores: a
  matrix at the floor adds to the share kept.

Masks are torch.nn.utils.parametrize parametrizations on `weight`, so the model's code stays
plain nn.Linear; `bake` removes them, leaving the zeros in the weights: the saved model loads
as a normal model (dense: same size on disk, no speed-up from dense kernels).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils import parametrize

from lmforge.config.options import OptionsError
from lmforge.quant import int8

METHODS = ("magnitude", "movement", "soft-movement")
FLOOR = 0.005  # soft movement: the share of each matrix always kept (the reference's min_elements)


def cubic_sparsity(step: int, final: float, start: int, end: int, initial: float = 0.0) -> float:
    """Zhu & Gupta's s_t: `initial` up to step `start`, `final` from `end`, cubic in between."""
    if step <= start:
        return initial
    if step >= end:
        return final
    return final + (initial - final) * (1.0 - (step - start) / (end - start)) ** 3


def floor(n: int) -> int:
    """Soft movement: the weights a matrix of n always keeps (FLOOR of them, at least one)."""
    return max(1, math.ceil(FLOOR * n))


def kept(n: int, sparsity: float) -> int:
    """Weights a matrix of n keeps at `sparsity` (at least one)."""
    return max(1, n - round(n * sparsity))


def parts_top_k(scores: torch.Tensor, sparsity: float, rows: list | None = None) -> torch.Tensor:
    """top_k_mask of each block of output rows `rows` (the matrices a fused Linear holds; None: one),
    each keeping `kept` of its own weights at `sparsity`."""
    blocks = scores.split(rows) if rows else (scores,)
    return torch.cat([top_k_mask(b, kept(b.numel(), sparsity)) for b in blocks])


def top_k_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """A 0/1 tensor shaped like `scores` with exactly k ones, at the k largest scores."""
    mask = torch.zeros(scores.numel(), dtype=scores.dtype, device=scores.device)
    if k >= scores.numel():
        return mask.fill_(1.0).view_as(scores)
    mask[scores.detach().flatten().topk(k, sorted=False).indices] = 1.0
    return mask.view_as(scores)


class StraightThrough(torch.autograd.Function):
    """A mask chosen from the scores (a top-k) forward; the gradient passes to S unchanged
    (Sanh et al. 2020, eq. 4)."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The given mask."""
        return mask

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        """Straight through: dL/dS = dL/dM."""
        return grad, None


class MagnitudeMask(nn.Module):
    """W -> W * mask; the mask (a buffer, so checkpoints carry it) keeps the largest |W| of each
    matrix (`rows`: the output rows of each matrix a fused Linear holds)."""

    def __init__(self, weight: torch.Tensor, rows: list | None = None) -> None:
        super().__init__()
        self.rows = rows
        self.register_buffer("mask", torch.ones_like(weight))
        self.register_buffer("sparsity", torch.zeros(()))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        """The masked weight."""
        return weight * self.mask

    @torch.no_grad()
    def update(self, weight: torch.Tensor, sparsity: float) -> None:
        """Re-rank on |W| x mask (pruned weights stay out) when the sparsity rises."""
        if sparsity > float(self.sparsity):
            self.mask.copy_(parts_top_k(weight.abs() * self.mask, sparsity, self.rows))
            self.sparsity.fill_(sparsity)


class MovementMask(nn.Module):
    """W -> W * TopK(S) with learned scores S (straight-through), Sanh et al. 2020; TopK of each
    matrix a fused Linear holds (`rows`) on its own."""

    def __init__(self, weight: torch.Tensor, rows: list | None = None) -> None:
        super().__init__()
        self.rows = rows
        # the reference's mask_init "constant", mask_scale 0: every weight starts equal
        self.scores = nn.Parameter(torch.zeros_like(weight))
        self.scores.no_weight_decay = True  # the reference's scores group has no decay
        self.register_buffer("sparsity", torch.zeros(()))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        """The masked weight; gradients reach both W (through the mask) and S (straight through)."""
        mask = parts_top_k(self.scores, float(self.sparsity), self.rows)
        return weight * StraightThrough.apply(self.scores, mask).to(weight.dtype)

    @torch.no_grad()
    def update(self, weight: torch.Tensor, sparsity: float) -> None:
        """Set the share pruned; the mask follows the scores at every forward."""
        self.sparsity.fill_(sparsity)


class SoftMovementMask(MovementMask):
    """W -> W * M (straight-through to S), M this matrix's part of the global top-k of the scores,
    which the Pruner sets (1[S > tau] for the tau that keeps the share, ties broken)."""

    def __init__(self, weight: torch.Tensor, rows: list | None = None) -> None:
        super().__init__(weight, rows)  # the top-k is global here: rows set the floors and the penalty
        self.register_buffer("mask", torch.ones_like(weight))
        self.settle = None  # the Pruner's, on the first matrix: every forward re-chooses M

    def floored(self, part: torch.Tensor) -> torch.Tensor:
        """`part` (this matrix's share of the global top-k) with each matrix it fuses (q, k, v apart,
        as the reference's) kept at least at its floor, by its largest scores."""
        rows = self.rows or [len(part)]
        blocks = zip(self.scores.detach().split(rows), part.split(rows))
        return torch.cat([p if int(p.sum()) >= floor(s.numel()) else top_k_mask(s, floor(s.numel()))
                          for s, p in blocks])

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        """The masked weight: every weight before the first cut (the scores learn meanwhile, the
        initial warm-up), then those of the top scores."""
        if self.settle is not None:
            self.settle()
        return weight * StraightThrough.apply(self.scores, self.mask).to(weight.dtype)


MASKS = {"magnitude": MagnitudeMask, "movement": MovementMask, "soft-movement": SoftMovementMask}


PRUNING = "pruning it is refused; prune the fp32 model, then lmforge quantize the result"  # int8's way out


def refuse_int8(model: nn.Module) -> None:
    """A ValueError naming the way out where `model` holds int8 Linears: they have no fp32 weights to
    rank, mask or slice, and a pruned copy would not load."""
    int8.refuse_int8(model, PRUNING)


def smallest_sparsity(removes, n: int) -> float:
    """The smallest sparsity of 4 decimals at which `removes(sparsity)` holds, for a rounding of shares
    of n things (nothing below half of one of them, and 1 / n rounded up removes one)."""
    k = max(1, math.floor(0.5e4 / n))
    while not removes(k / 1e4):
        k += 1
    return k / 1e4


def prunable(model: nn.Module) -> dict:
    """name -> nn.Linear of every Linear inside the blocks (attention and FFN); the embeddings
    and the task head stay dense, as in both papers."""
    refuse_int8(model)
    out = {}
    for stack_name in ("encoder", "decoder"):
        blocks = getattr(getattr(model, stack_name, None), "blocks", None)
        for name, module in (blocks.named_modules() if blocks is not None else ()):
            if isinstance(module, nn.Linear):
                out[f"{stack_name}.blocks.{name}"] = module
    if not out:
        raise ValueError("the model has no Linear layers in its blocks to prune")
    return out


def fused_rows(model: nn.Module, name: str, linear: nn.Linear) -> list:
    """The output rows of each matrix a Linear fuses: q, k, v in attention's qkv (and Longformer's
    global_qkv), k, v in its cross kv; [out_features] for any other."""
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name)
    if leaf in ("qkv", "global_qkv", "kv") and hasattr(parent, "n_kv"):
        kv = parent.n_kv * parent.dh
        return ([linear.out_features - 2 * kv] if leaf != "kv" else []) + [kv, kv]
    return [linear.out_features]


class Pruner:
    """Masks on `model`'s block Linears by `method`, following the cubic schedule to `sparsity`."""

    def __init__(self, model: nn.Module, method: str, sparsity: float, start: int, end: int,
                 soft_lambda: float = 0.0) -> None:
        if method not in METHODS:
            raise ValueError(f"method {method!r}: expected one of {', '.join(METHODS)}")
        if not 0 < sparsity < 1:
            raise ValueError(f"sparsity {sparsity}: the share of weights removed, in (0, 1)")
        if not 0 <= start <= end:
            raise ValueError(f"the schedule needs 0 <= start <= end, got {start}, {end}")
        if soft_lambda < 0:
            raise ValueError(f"soft_lambda {soft_lambda}: the L1 penalty's weight, >= 0")
        self.model, self.method, self.sparsity, self.start, self.end = model, method, sparsity, start, end
        self.soft_lambda = soft_lambda
        self.linears = prunable(model)
        self.rows = [fused_rows(model, name, linear) for name, linear in self.linears.items()]
        _refuse_nothing_removed(method, sparsity, [r * linear.in_features for linear, rows
                                                   in zip(self.linears.values(), self.rows) for r in rows])
        for linear, rows in zip(self.linears.values(), self.rows):
            parametrize.register_parametrization(linear, "weight", MASKS[method](linear.weight, rows))
        if method == "soft-movement":  # the first matrix a forward meets re-chooses all the masks
            self.masks()[0][1].settle = self.settle

    def masks(self) -> list:
        """(linear, its mask module) pairs."""
        return [(m, m.parametrizations.weight[0]) for m in self.linears.values()]

    def at(self, step: int) -> float:
        """Bring every mask to the schedule's sparsity at `step`; returns it."""
        s = cubic_sparsity(step, self.sparsity, self.start, self.end)
        for linear, mask in self.masks():
            mask.update(linear.parametrizations.weight.original, s)
        return s

    @torch.no_grad()
    def settle(self) -> None:
        """Soft movement: the masks of the global top-k scores at the current share, each matrix
        at least its floor. Run at every forward (from the first matrix's mask), as hard movement's
        top-k: a check for changed scores cannot rest on version counters, which the fused AdamW
        step does not advance."""
        if self.method != "soft-movement":
            return
        masks = [mask for _, mask in self.masks()]
        if float(masks[0].sparsity) == 0:
            return
        scores = torch.cat([m.scores.detach().flatten() for m in masks])
        # top-k rather than S > tau: early scores are few distinct values (Adam's first steps
        # move each by +-lr), and a threshold among ties would keep far fewer than k
        on = top_k_mask(scores, kept(scores.numel(), float(masks[0].sparsity)))
        for m, part in zip(masks, on.split([m.scores.numel() for m in masks])):
            part = part.view_as(m.scores)
            # a new tensor, not copy_: a graph not yet backpropagated may hold the old one
            m.mask = m.floored(part.clone())

    def penalty(self) -> torch.Tensor | None:
        """Soft movement's L1 term: lambda x s_t / s_f x the mean over matrices of mean sigmoid(S),
        a fused projection counted as the matrices it fuses (the reference's BERT has q, k, v apart)."""
        if self.method != "soft-movement" or self.soft_lambda == 0:
            return None
        masks = [mask for _, mask in self.masks()]
        ramp = float(masks[0].sparsity) / self.sparsity
        means = [part.mean() for m, rows in zip(masks, self.rows)
                 for part in torch.sigmoid(m.scores).split(rows)]
        return self.soft_lambda * ramp * torch.stack(means).mean()

    def bake(self) -> nn.Module:
        """Remove the parametrizations, keeping W * mask in the weights; returns the plain model."""
        self.settle()
        if self.method == "soft-movement":  # the masks are final: none may look for matrices baked before it
            self.masks()[0][1].settle = None
        for linear in self.linears.values():
            if parametrize.is_parametrized(linear, "weight"):
                parametrize.remove_parametrizations(linear, "weight", leave_parametrized=True)
        return self.model


def _refuse_nothing_removed(method: str, sparsity: float, sizes: list) -> None:
    """An OptionsError naming sparsity where it rounds to no weight at all: each matrix (soft movement: all
    of them together) keeps whole weights."""
    pools = [sum(sizes)] if method == "soft-movement" else sizes
    if all(kept(n, sparsity) == n for n in pools):
        n, largest = len(sizes), max(pools)
        where = (f"the {n} block matrices hold {largest:,} weights in all" if method == "soft-movement"
                 else f"the largest of the {n} block matrices has {largest:,} weights")
        smallest = smallest_sparsity(lambda s: kept(largest, s) < largest, largest)
        raise OptionsError(f"sparsity {sparsity} removes no weight ({where}); the smallest sparsity that "
                           f"removes one is {smallest}", "sparsity")


def is_score(name: str) -> bool:
    """Whether a parameter name is a movement score (its own learning rate, see Pruner)."""
    return name.endswith(".scores") and ".parametrizations." in name


def weight_sparsity(model: nn.Module) -> dict:
    """Zeros among the block Linear weights: {"zeros", "weights", "sparsity"} (masks applied)."""
    zeros = total = 0
    for linear in prunable(model).values():
        w = linear.weight
        zeros, total = zeros + int((w == 0).sum()), total + w.numel()
    return {"zeros": zeros, "weights": total, "sparsity": zeros / total}


def kept_by_matrix(model: nn.Module) -> dict:
    """name -> share of each block Linear's weights left nonzero (soft movement's differ by matrix)."""
    return {name: round(float(linear.weight.ne(0).float().mean()), 4)
            for name, linear in prunable(model).items()}
