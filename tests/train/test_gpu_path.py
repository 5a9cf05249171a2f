"""The training loop's GPU path, checked on the CPU: bf16 autocast over fp32 weights, compile with bf16,
activation checkpointing, fused AdamW, and guards read back only at logged steps."""
import json

import pytest
import torch

from lmforge.layers.block import Block
from lmforge.train import Trainer, TrainingDiverged
from lmforge.train import speed
from tests.train.helpers import mlm_objective, quick, toy_data


def _losses(out):
    return [json.loads(row)["loss"] for row in (out / "metrics.jsonl").read_text().splitlines()]


def test_bf16_trains_close_to_fp32_with_fp32_weights_and_optimizer_state(tmp_path):
    runs = {}
    for precision in ("fp32", "bf16"):
        cfg = quick(steps=3, precision=precision)
        trainer = Trainer(mlm_objective(), toy_data(), cfg, tmp_path / precision)
        trainer.fit()
        runs[precision] = _losses(tmp_path / precision)
        assert {p.dtype for p in trainer.objective.parameters()} == {torch.float32}  # the master weights
        state = [t for s in trainer.optimizer.state.values() for t in s.values() if t.is_floating_point()]
        assert state and {t.dtype for t in state} == {torch.float32}
    # bf16 keeps 8 mantissa bits: a tiny model's loss moves by well under 2 %
    assert runs["bf16"] == pytest.approx(runs["fp32"], rel=2e-2)


@pytest.mark.slow
def test_compiled_bf16_step_equals_eager_bf16(tmp_path):
    losses = []
    for compiled in (False, True):
        objective = mlm_objective(dropout=0.0, attention_dropout=0.0)  # compiled dropout draws other masks
        cfg = quick(steps=2, precision="bf16", compile=compiled)
        Trainer(objective, toy_data(), cfg, tmp_path / str(compiled)).fit()
        losses.append(_losses(tmp_path / str(compiled)))
    # fusion changes where bf16 rounds: agreement to bf16's resolution, not bitwise
    assert losses[1] == pytest.approx(losses[0], rel=1e-2)


def test_checkpointing_gives_the_plain_gradients_and_is_undone_after_fit(tmp_path):
    results = []
    for on in (False, True):
        trainer = Trainer(mlm_objective(), toy_data(), quick(steps=2, checkpointing=on), tmp_path / str(on))
        blocks = [m for m in trainer.objective.modules() if isinstance(m, Block)]
        assert all(("forward" in b.__dict__) == on for b in blocks) and blocks
        model = trainer.fit()
        assert not any("forward" in b.__dict__ for b in blocks)  # the model runs plain again
        results.append((_losses(tmp_path / str(on)), {k: v.clone() for k, v in model.state_dict().items()}))
    assert results[1][0] == results[0][0]  # dropout on: checkpoint replays the same masks
    for name, value in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], value, rtol=0, atol=1e-6)


def test_adamw_is_fused_on_plain_float_parameters(tmp_path):
    trainer = Trainer(mlm_objective(), toy_data(), quick(steps=1), tmp_path)
    assert trainer.optimizer.defaults["fused"]


def test_the_host_reads_the_device_only_at_logged_steps(tmp_path, monkeypatch):
    reads = []
    original = speed.Pending.read

    def counted(self, params, world):
        reads.append(trainer.step)
        return original(self, params, world)

    monkeypatch.setattr(speed.Pending, "read", counted)
    trainer = Trainer(mlm_objective(), toy_data(), quick(steps=7, log_every=3), tmp_path)
    trainer.fit()
    assert reads == [3, 6, 7]  # logged steps and the last one
    assert [json.loads(r)["step"] for r in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [3, 6, 7]


def test_a_nan_loss_between_reads_is_named_and_leaves_the_weights_untouched(tmp_path):
    objective = mlm_objective()
    trainer = Trainer(objective, toy_data(), quick(steps=8, log_every=4), tmp_path)
    original = objective.forward

    def poisoned(batch):
        out = original(batch)
        if trainer.step == 4:  # the 5th step, read back at step 8
            out.loss = out.loss * float("nan")
        return out

    objective.forward = poisoned
    with pytest.raises(TrainingDiverged, match="loss is not finite at step 5"):
        trainer.fit()
    # the fused AdamW skipped step 5's update (found_inf); the later steps also saw finite losses
    assert all(torch.isfinite(p).all() for p in objective.parameters())
    assert not (tmp_path / "final").exists()


def test_gpu_options_are_typed():
    from lmforge.config.options import OptionsError
    from lmforge.train import TrainConfig

    assert TrainConfig().tf32 is True and TrainConfig().checkpointing is False
    with pytest.raises(OptionsError, match="checkpointing"):
        TrainConfig(checkpointing="yes")
    speed.use_tf32(torch.device("cpu"), False)  # nothing to set off CUDA
