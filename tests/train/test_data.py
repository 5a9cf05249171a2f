"""Which examples a step sees and how they are corrupted: dynamic vs static masking."""
import pytest
import torch

from lmforge.train.data import StepBatches, eval_batches


class Noise:
    """A stand-in objective whose corruption is one random draw per example."""

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        return {**example, "draw": float(torch.rand((), generator=generator))}


def _draws(duplication: int, epochs: int, n: int = 8) -> list:
    """Per epoch, {example index: its corruption's draw}."""
    data = StepBatches([{"index": i} for i in range(n)], Noise(), 1, 1, seed=3, duplication=duplication)
    out = []
    for epoch in range(epochs):
        seen = [data.example(epoch * n + p) for p in range(n)]
        out.append({e["index"]: e["draw"] for e in seen})
    return out


def test_static_masking_repeats_its_copies_and_dynamic_masking_never_repeats():
    static = _draws(duplication=2, epochs=5)
    assert static[0] == static[2] == static[4] and static[1] == static[3]  # epoch e uses copy e % 2
    assert all(static[0][i] != static[1][i] for i in range(8))  # the two copies differ
    dynamic = _draws(duplication=0, epochs=3)
    assert all(len({d[i] for d in dynamic}) == 3 for i in range(8))
    assert dynamic[0] == static[0]  # copy 0 is the first epoch's dynamic draw: the same seed stream


def test_bad_duplication_is_refused():
    with pytest.raises(ValueError, match="duplication must be an integer >= 0"):
        StepBatches([{"index": 0}], Noise(), 1, 1, seed=0, duplication=-1)


def test_static_masking_with_more_copies_than_epochs_is_said(tmp_path):
    from lmforge.train import TrainConfig
    from lmforge.train.loop import Trainer

    lines = []
    trainer = Trainer.__new__(Trainer)  # only what _warn reads
    trainer._data = ([{"index": i} for i in range(8)], None, 10, None)
    cfg = TrainConfig(steps=4, batch_size=4, warmup=0)  # no warm-up note: only the duplication's
    trainer.cfg, trainer.world, trainer.rank, trainer.log = cfg, 1, 0, lines.append
    trainer.eval_set, trainer.evaluator = [], None
    trainer._warn()  # 4 x 4 / 8 = 2 epochs < 10 copies
    assert lines and "duplication=10" in lines[0] and "2.00 epochs" in lines[0]
    trainer._data = ([{"index": i} for i in range(8)], None, 1, None)
    lines.clear()
    trainer._warn()
    assert lines == []


def test_the_data_fingerprint_sees_content_and_order_and_samples_a_lazy_view():
    from lmforge.train.data import SAMPLED, data_fingerprint

    data = [{"input_ids": [5, 6, i], "label": i % 2} for i in range(10)]
    same = [{"label": r["label"], "input_ids": list(r["input_ids"])} for r in data]  # key order aside
    assert data_fingerprint(data) == data_fingerprint(same) and data_fingerprint(data)["examples"] == 10
    edited = [dict(r) for r in data]
    edited[7] = {**edited[7], "input_ids": [5, 6, 70]}
    for other in (edited, data[::-1], data[:9],
                  [{**r, "input_ids": torch.tensor(r["input_ids"])} for r in data]):
        assert data_fingerprint(other)["sha256"] != data_fingerprint(data)["sha256"]

    class Lazy:  # a shard view: read on access, too large to read whole at each checkpoint
        def __init__(self, n):
            self.n, self.read = n, 0

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            self.read += 1
            return {"input_ids": torch.full((4,), i)}

    lazy = Lazy(10 * SAMPLED)
    seen = data_fingerprint(lazy)
    assert seen["sampled"] == lazy.read == SAMPLED and seen["examples"] == 10 * SAMPLED
    assert data_fingerprint(Lazy(10 * SAMPLED + 1))["sha256"] != seen["sha256"]


class Counted(Noise):
    """Noise that counts its corruptions and collates a batch into a list."""

    def __init__(self) -> None:
        self.made = 0

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        self.made += 1
        return super().corrupt(example, generator)

    def collate(self, examples: list) -> dict:
        return {"rows": examples}


def test_the_evaluation_set_is_made_a_batch_at_a_time_and_the_same_each_time():
    # all eval_batches x batch_size examples were corrupted and collated before the first step
    objective = Counted()
    data = [{"index": i} for i in range(10 ** 6)]
    held = eval_batches(data, objective, batch_size=4, n_batches=100_000, seed=1)
    assert objective.made == 0 and len(held) == 100_000
    assert held[0] == held[0] and objective.made == 8  # one batch each read, drawn alike
    assert [r["index"] for r in held[99_999]["rows"]] == list(range(399_996, 400_000))
    short = eval_batches(data[:10], objective, batch_size=4, n_batches=8, seed=1)
    assert [len(b["rows"]) for b in short] == [4, 4, 2]
    assert short[0]["rows"] != eval_batches(data, objective, 4, 8, seed=2)[0]["rows"]  # the seed decides
    with pytest.raises(IndexError):
        short[3]
