"""Training small classifiers on frozen features: the probes of analysis/probing.py and
analysis/structural_probe.py, and the task heads of feature-based transfer (analysis/feature_transfer.py).

Features live once in a word table H (L, W, d): L layers, W words of a split. An example is k
word indices into it (k = 1: a word; k = 2: a word pair, Tenney et al. 2019's edge probing over
one-word spans) and one label per label set (a task's labels, its control task's). A `Probe`
mixes its layers with a ScalarMix (Peters et al. 2018, eq. 1), concatenates the k vectors and
classifies them with a linear map or an MLP with one hidden layer (Hewitt & Liang 2019's MLP-1).
`LayerProbes` holds G independent probes, probe g reading layer layers[g] and label set
label_sets[g]: their losses add, and Adam is per parameter, so each trains as it would alone,
while one batched matrix product serves them all (and a probe that has stopped leaves it).

Training: Adam on minibatches, seeded (the initialisation and the order of the examples), with
early stopping on the development score of each probe separately; each keeps its best state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import torch
from torch import nn

from lmforge.config import option
from lmforge.config.options import check_options
from lmforge.layers.scalar_mix import ScalarMix
from lmforge.train.config import options_from_dict

MAX_EPOCHS = 10_000  # passes (and patience) of one probe's training
MAX_BATCH = 65_536  # examples or sentences per step
MAX_WIDTH = 4096  # an MLP's hidden units, a structural probe's rank: G layers x d x this x 4 (Adam) floats

HEADS = ("linear", "mlp")


@dataclass
class FitConfig:
    """How a probe or a feature-based head is trained (each field bounded both ways, checked when built)."""

    epochs: int = option(30, "most passes over the training examples", low=1, high=MAX_EPOCHS)
    lr: float = option(1e-3, "Adam learning rate", low=0, high=10, open_low=True)
    mix_lr: float = option(1e-2, "Adam learning rate of a scalar mix's s and gamma (at lr, a few hundred "
                                 "steps leave softmax(s) almost uniform)", low=0, high=10)
    batch_size: int = option(256, "examples (words, word pairs) per step", low=1, high=MAX_BATCH)
    sentence_batch: int = option(20, "sentences per step of a structural probe (Hewitt & Manning 2019)",
                                 low=1, high=MAX_BATCH)
    patience: int = option(3, "epochs without a better development score before stopping", low=1,
                           high=MAX_EPOCHS)
    hidden: int = option(256, "hidden units of an MLP probe or head", low=1, high=MAX_WIDTH)
    rank: int = option(64, "rank of a structural probe's B (Hewitt & Manning 2019)", low=1, high=MAX_WIDTH)
    weight_decay: float = option(0.0, "Adam weight decay", low=0, high=10)

    def __post_init__(self) -> None:
        check_options(self)  # types (a bool is not a number), finiteness and bounds, naming the field

    @classmethod
    def from_dict(cls, values: dict) -> FitConfig:
        """A FitConfig from key=value options; an unknown key or a bad value is an OptionsError naming it."""
        return options_from_dict(cls, values, "")


def _head(d_in: int, n_out: int, head: str, hidden: int) -> nn.Module:
    if head not in HEADS:
        raise ValueError(f"probe head {head!r} is not one of {', '.join(HEADS)}")
    if head == "linear":
        return nn.Linear(d_in, n_out)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))


class Probe(nn.Module):
    """One probe: [ScalarMix over its L layers ->] the k vectors concatenated -> linear or MLP."""

    groups = 1

    def targets(self, labels: torch.Tensor) -> torch.Tensor:
        """(1, B) the probe's gold labels (label set 0) of (M, B) labels."""
        return labels[:1]

    def __init__(self, d: int, n_labels: int, arity: int = 1, head: str = "linear", hidden: int = 256,
                 n_mix: int = 1) -> None:
        super().__init__()
        self.mix = ScalarMix(n_mix) if n_mix > 1 else None
        self.net = _head(arity * d, n_labels, head, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (L, B, k, d) -> (1, B, n_labels)."""
        h = self.mix(x) if self.mix is not None else x[0]  # (B, k, d)
        return self.net(h.flatten(1))[None]


class LayerProbes(nn.Module):
    """G independent linear or MLP probes, probe g on layer layers[g] with label set label_sets[g]."""

    def __init__(self, d_in: int, n_labels: int, layers: list, label_sets: list, head: str = "linear",
                 hidden: int = 256) -> None:
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"probe head {head!r} is not one of {', '.join(HEADS)}")
        G = self.groups = len(layers)
        self.register_buffer("layers", torch.tensor(layers), persistent=False)
        self.register_buffer("label_sets", torch.tensor(label_sets), persistent=False)
        widths = [d_in, n_labels] if head == "linear" else [d_in, hidden, n_labels]
        self.weights = nn.ParameterList(nn.Parameter(torch.empty(G, a, b)) for a, b in pairwise(widths))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(G, 1, b)) for b in widths[1:])
        self.active = None  # (G,) bool while training: the probes still learning (None: all)

    def _groups(self) -> torch.Tensor | slice:
        return self.active if self.training and self.active is not None else slice(None)

    def targets(self, labels: torch.Tensor) -> torch.Tensor:
        """(G', B) each (active) probe's gold labels of (M, B) labels."""
        return labels[self.label_sets[self._groups()]]

    def inputs(self, x: torch.Tensor, g: torch.Tensor | slice) -> torch.Tensor:
        """x (L, B, k, d) -> (G', B, k d): what probes g read, here each its own layer."""
        return x[self.layers[g]].flatten(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (L, B, k, d) -> (G', B, n_labels) of the probes still training (all in eval mode)."""
        g = self._groups()
        h = self.inputs(x, g)  # (G', B, k d)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(b[g], h if i == 0 else torch.relu(h), w[g])
        return h


class PrefixMix(nn.Module):
    """G scalar mixes (Peters et al. 2018, eq. 1), mix g over layers 0..g only: its s outside the
    prefix is masked to -inf, so softmax gives those layers exactly zero weight."""

    def __init__(self, n_layers: int) -> None:
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(n_layers, n_layers))  # s = 0: uniform over each prefix
        self.gamma = nn.Parameter(torch.ones(n_layers))
        self.register_buffer("outside", torch.ones(n_layers, n_layers, dtype=torch.bool).triu(1),
                             persistent=False)

    @property
    def weights(self) -> torch.Tensor:
        """(G, L) softmax(s) of each mix, zero past its prefix."""
        return torch.softmax(self.scalars.masked_fill(self.outside, -math.inf), dim=-1)

    def forward(self, x: torch.Tensor, g: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        """x (L, B, k, d) -> (G', B, k, d): mixes g of the layers."""
        mixed = torch.einsum("gl,lbkd->gbkd", self.weights[g].to(x.dtype), x)
        return self.gamma[g].to(x.dtype)[:, None, None, None] * mixed


class PrefixMixProbes(LayerProbes):
    """Tenney et al.'s (2019) cumulative scoring in one batched module: probe g classifies the
    scalar mix of layers 0..g (label set 0); as in LayerProbes, each trains as it would alone."""

    def __init__(self, d: int, n_labels: int, n_layers: int, arity: int = 1, head: str = "mlp",
                 hidden: int = 256) -> None:
        super().__init__(arity * d, n_labels, list(range(n_layers)), [0] * n_layers, head, hidden)
        self.mix = PrefixMix(n_layers)

    def inputs(self, x: torch.Tensor, g: torch.Tensor | slice) -> torch.Tensor:
        """x (L, B, k, d) -> (G', B, k d): each probe's mix of its prefix."""
        return self.mix(x, g).flatten(2)


class Examples:
    """Examples over a word table: H (L, W, d), index (N, k) into W, labels (M, N): M label sets."""

    def __init__(self, table: torch.Tensor, index: torch.Tensor, labels: torch.Tensor) -> None:
        self.table, self.index, self.labels = table, index, labels

    def __len__(self) -> int:
        return self.index.shape[0]

    def batch(self, rows: torch.Tensor) -> tuple:
        """(inputs (L, B, k, d), labels (M, B)) of the examples `rows`."""
        return self.table[:, self.index[rows]], self.labels[:, rows]


def predict(module: nn.Module, data: Examples, chunk: int = 4096) -> torch.Tensor:
    """(G, N) each probe's most likely label of every example."""
    module.eval()
    with torch.no_grad():
        return torch.cat([module(data.batch(rows)[0]).argmax(-1)
                          for rows in torch.arange(len(data)).split(chunk)],
                         dim=1)


def accuracy(module: nn.Module, data: Examples) -> torch.Tensor:
    """(G,) each probe's fraction of examples given their gold label (of its label set)."""
    if not len(data):
        return torch.full((module.groups,), math.nan)
    module.eval()
    return (predict(module, data) == module.targets(data.labels)).float().mean(1)


def classification_loss(module: nn.Module, batch: tuple) -> torch.Tensor:
    """Cross-entropy of each probe against its label set, summed over the probes."""
    inputs, labels = batch
    logits = module(inputs)  # (G, B, C)
    gold = module.targets(labels)  # (G, B)
    return nn.functional.cross_entropy(logits.flatten(0, 1), gold.flatten(), reduction="none").view(
        gold.shape).mean(1).sum()


def _init(module: nn.Module, seed: int) -> None:
    """Weights re-drawn from the seed (the same probe whatever ran before), biases zero; the
    caller's random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, p in module.named_parameters():
            if name.startswith("mix."):  # a scalar mix starts as built: uniform weights, gamma 1
                continue
            if name.endswith("bias") or name.startswith("biases"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                nn.init.xavier_uniform_(p)
            elif p.dim() == 3:  # (G, fan_in, fan_out): each probe as xavier would draw it alone
                bound = getattr(module, "init_bound", None) or math.sqrt(6.0 / (p.shape[1] + p.shape[2]))
                nn.init.uniform_(p, -bound, bound)


def _keep(best: dict, module: nn.Module, improved: torch.Tensor) -> None:
    """Copy the improved probes' parameters (leading dimension G, or everything for one probe)."""
    for name, p in module.state_dict().items():
        if module.groups == 1:
            best[name] = p.detach().clone() if bool(improved[0]) else best[name]
        else:
            best[name][improved] = p.detach()[improved]


def _step(optimiser, module: nn.Module, rate: torch.Tensor) -> None:
    """optimiser.step() with probe g's update scaled by rate[g], i.e. at its own learning rate: the G
    probes share their parameters' tensors (leading dimension G), so no param group (and no
    lr_scheduler, which sets a group's) can hold one probe's rate."""
    if bool((rate == 1).all()):
        optimiser.step()
        return
    own = [p for name, p in module.named_parameters() if not name.startswith("mix.")]
    before = [p.detach().clone() for p in own]
    optimiser.step()
    with torch.no_grad():
        for p, old in zip(own, before):  # Adam's update is linear in lr: old + rate (new - old)
            scale = rate.to(p).reshape(-1, *[1] * (p.dim() - 1)) if module.groups > 1 else rate[0].to(p)
            p.sub_(old).mul_(scale).add_(old)


def fit(module: nn.Module, train, dev, config: FitConfig, seed: int, loss=classification_loss,
        score=accuracy, lr_cut: float = 1.0) -> dict:
    """Train `module` on `train` (anything with len() and batch(rows)); keep each probe's state with
    its best score(module, dev) (a (G,) tensor), and stop once every probe has gone `patience` epochs
    without a better one. `lr_cut` < 1 multiplies a probe's learning rate by it after each epoch
    without a better score (ReduceLROnPlateau's patience 0, per probe). Returns {"dev": best scores,
    "epochs": epochs run, "lr": each probe's last learning rate}."""
    _init(module, seed)
    generator = torch.Generator().manual_seed(seed)
    mix = [p for name, p in module.named_parameters() if name.startswith("mix.")]
    rest = [p for name, p in module.named_parameters() if not name.startswith("mix.")]
    # fused: one kernel per step instead of a dozen passes over every probe's parameters (on CPU
    # the optimiser step otherwise costs about as much as the probes' forward and backward)
    optimiser = torch.optim.Adam([{"params": rest}, {"params": mix, "lr": float(config.mix_lr)}],
                                 lr=float(config.lr), weight_decay=config.weight_decay, fused=True)
    best_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    best = torch.full((module.groups,), -math.inf)
    waited = torch.zeros(module.groups, dtype=torch.long)
    rate = torch.ones(module.groups)  # each probe's learning rate, as a share of config.lr
    epoch = 0
    for epoch in range(1, config.epochs + 1):
        module.train()
        active = waited < config.patience  # a probe that has stopped stays stopped, as it would alone
        if hasattr(module, "active"):  # and leaves the batched products
            module.active = active
        for rows in torch.randperm(len(train), generator=generator).split(config.batch_size):
            optimiser.zero_grad()
            loss(module, train.batch(rows)).backward()
            _step(optimiser, module, rate)
        value = torch.as_tensor(score(module, dev), dtype=torch.float).cpu().reshape(module.groups)
        improved = (value > best) & active
        _keep(best_state, module, improved)
        best, waited = torch.where(improved, value, best), torch.where(improved, 0, waited + 1)
        rate = torch.where(active & ~improved, rate * lr_cut, rate)
        if bool((waited >= config.patience).all()):
            break
    module.load_state_dict(best_state)
    module.eval()
    return {"dev": best.tolist(), "epochs": epoch, "lr": (rate * config.lr).tolist()}
