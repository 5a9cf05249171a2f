"""Which examples each process sees at each step, deterministically from the seed.

The order is a fresh permutation of the dataset per epoch (seeded by seed and epoch), and
the global batch of step s is the examples at positions [sG, (s+1)G) of that endless
order, G = batch_size x accumulation x world. The step alone is the data position: a
resumed run recomputes exactly the batches it would have seen. Micro-batch m of a step
goes to rank m % world, so one process with accumulation k x w computes the same
micro-batches as w processes with accumulation k.

Each example is corrupted with a generator seeded by (seed, epoch, index): dynamic
masking draws a new corruption every epoch, static masking (BERT's duplication factor
d) reuses epoch % d.

A run's data is recorded by fingerprint (data_fingerprint) in its checkpoints, so a resume on
other data is refused rather than continued as if it were the same run.
"""
from __future__ import annotations

import hashlib
from array import array

import numpy as np
import torch

MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads nearby seeds apart


def derive_seed(*parts: int) -> int:
    """One 63-bit seed from several integers (order matters)."""
    h = 0
    for part in parts:
        h = ((h ^ (int(part) & 0xFFFFFFFFFFFFFFFF)) * MIX + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h & 0x7FFFFFFFFFFFFFFF


SAMPLED = 4096  # examples a lazy dataset (shards read on access) is fingerprinted by, evenly spaced


def data_fingerprint(dataset) -> dict:
    """{"examples": n, "sha256": ...} of a training set, order included: every example of a list
    (fine-tuning sets, built in memory), SAMPLED evenly spaced ones of a lazy view over shards
    (reading all of a large corpus again at each checkpoint would cost minutes; the shards'
    manifest already checks their bytes)."""
    n = len(dataset)
    whole = isinstance(dataset, (list, tuple)) or n <= SAMPLED
    picks = range(n) if whole else sorted({i * (n - 1) // (SAMPLED - 1) for i in range(SAMPLED)})
    digest = hashlib.sha256(str(n).encode())
    for i in picks:
        _digest_value(digest, dataset[i])
    return {"examples": n, "sha256": digest.hexdigest(), **({} if whole else {"sampled": len(picks)})}


def data_change(run: dict | None, now: dict) -> str | None:
    """How the data_fingerprint a run recorded differs from `now`'s, for a refusal to resume ("N
    examples (the run's) vs M (now), their contents differ"); None where they agree or the run recorded
    none (checkpoints from before fingerprints)."""
    if run is None or run.get("sha256") == now["sha256"]:
        return None
    count = (f"{run.get('examples')} examples (the run's) vs {now['examples']} (now)"
             if run.get("examples") != now["examples"] else f"the same {now['examples']} examples in count")
    return f"{count}, their contents differ"


def _digest_value(digest, value) -> None:
    """Feed one example (dicts, lists, tensors, numbers, strings, nested) into `digest`, unambiguously."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        digest.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, np.ndarray):  # its repr elides the middle of a long array
        digest.update(f"A{value.dtype}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        digest.update(f"D{len(value)}".encode())
        for key in sorted(value, key=str):
            digest.update(f"{key!s}:".encode())
            _digest_value(digest, value[key])
    elif isinstance(value, (list, tuple)):
        try:  # token ids: one C-level conversion, not an update per id
            digest.update(b"I%d:" % len(value) + array("q", value).tobytes())
            return
        except (TypeError, OverflowError):  # not all 64-bit integers
            pass
        digest.update(f"L{len(value)}".encode())
        for item in value:
            _digest_value(digest, item)
    else:
        digest.update(f"V{type(value).__name__}{value!r};".encode())


class StepBatches:
    """Micro-batches of one process for any step of a run."""

    def __init__(self, dataset, objective, batch_size: int, accumulation: int, seed: int,
                 rank: int = 0, world: int = 1, duplication: int = 0) -> None:
        if len(dataset) == 0:
            raise ValueError("the training data is empty")
        if not isinstance(duplication, int) or duplication < 0:
            raise ValueError(f"duplication must be an integer >= 0 (0: dynamic masking), got {duplication!r}")
        self.dataset, self.objective = dataset, objective
        self.batch_size, self.accumulation = batch_size, accumulation
        self.seed, self.rank, self.world = seed, rank, world
        self.duplication = duplication  # 0: dynamic corruption; d: static with d copies
        self._orders: dict = {}

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            gen = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
            self._orders = {epoch: torch.randperm(len(self.dataset), generator=gen)}  # keep one epoch
        return self._orders[epoch]

    def example(self, position: int) -> dict:
        """The corrupted example at a position of the endless order."""
        epoch, offset = divmod(position, len(self.dataset))
        index = int(self._order(epoch)[offset])
        pass_ = epoch % self.duplication if self.duplication else epoch
        gen = torch.Generator().manual_seed(derive_seed(self.seed, pass_, index, 1))
        return self.objective.corrupt(self.dataset[index], gen)

    def micro_batches(self, step: int) -> list:
        """This process's `accumulation` padded micro-batches of optimiser step `step`."""
        return [self.micro_batch(step, a) for a in range(self.accumulation)]

    def micro_batch(self, step: int, a: int) -> dict:
        """This process's padded micro-batch `a` of optimiser step `step` (the same each time it is drawn)."""
        m = a * self.world + self.rank
        start = step * self.batch_size * self.accumulation * self.world + m * self.batch_size
        return self.objective.collate([self.example(p) for p in range(start, start + self.batch_size)])


class EvalBatches:
    """A fixed evaluation set: the first examples of the data, corrupted the same way every time."""

    def __init__(self, dataset, objective, batch_size: int, n_batches: int, seed: int) -> None:
        # made a batch at a time as it is read: all eval_batches x batch_size examples at once (up to
        # 100,000 x 65,536 of a large held-out corpus) were built before the first step, past any memory;
        # remade at every evaluation, whose forward passes over them cost far more than their corruption
        self.dataset, self.objective, self.batch_size, self.seed = dataset, objective, batch_size, seed
        self.examples = min(len(dataset), batch_size * n_batches)

    def __len__(self) -> int:
        return -(-self.examples // self.batch_size)

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(f"evaluation batch {i} of {len(self)}")
        rows = range(i * self.batch_size, min(self.examples, (i + 1) * self.batch_size))
        return self.objective.collate([self.objective.corrupt(
            self.dataset[j], torch.Generator().manual_seed(derive_seed(self.seed, j, 2))) for j in rows])

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def eval_batches(dataset, objective, batch_size: int, n_batches: int, seed: int) -> EvalBatches:
    """The fixed evaluation set of `n_batches` batches (fewer where the data is short), made as read."""
    return EvalBatches(dataset, objective, batch_size, n_batches, seed)
