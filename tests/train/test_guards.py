"""Training guards: non-finite weights stop a run without saving them, a full disk is named and cleaned up."""
import errno
import time

import pytest
import torch
from safetensors.torch import load_file

from lmforge.cli import main
from lmforge.io.files import DiskFull
from lmforge.train import Trainer, TrainingDiverged, checkpoint
from lmforge.train.checkpoint import all_finite, read_checkpoint, save_checkpoint
from tests.train.helpers import mlm_objective, quick, toy_data


def _all_saved_weights(out):
    """Every tensor of every checkpoint and of the final model under a run directory."""
    files = list(out.glob("checkpoints/*/model.safetensors")) + list(out.glob("final/*.safetensors"))
    return {f: load_file(str(f)) for f in files}


def test_weights_past_float_range_stop_the_run_and_nothing_non_finite_is_saved(tmp_path):
    # lr=10 and weight_decay=10 scale every decayed weight by 1 - 100 = -99 in step 1's update: a
    # position row that no example reaches (1e37) leaves the loss finite and overflows to -inf
    objective = mlm_objective()
    with torch.no_grad():
        objective.model.embed.positions.weight[-1] = 1e37
    trainer = Trainer(objective, toy_data(), quick(steps=4, save_every=1, lr=10, weight_decay=10, warmup=0),
                      tmp_path)
    with pytest.raises(TrainingDiverged,
                       match=r"weights are not finite .* step 1.*last good checkpoint: none"):
        trainer.fit()
    assert not (tmp_path / "final").exists() and not list((tmp_path / "checkpoints").glob("step-*"))


def test_the_stop_names_the_last_truly_good_checkpoint(tmp_path):
    objective = mlm_objective()
    trainer = Trainer(objective, toy_data(), quick(steps=6, save_every=2), tmp_path)

    def ruin(optimizer, args, kwargs):  # step 3's update overflows the weights (its loss was finite)
        if trainer.step == 2:
            with torch.no_grad():
                next(objective.parameters()).fill_(float("inf"))

    trainer.optimizer.register_step_post_hook(ruin)
    with pytest.raises(TrainingDiverged, match="step 3.*last good checkpoint: .*step-0000002"):
        trainer.fit()
    saved = _all_saved_weights(tmp_path)
    assert [f.parent.name for f in saved] == ["step-0000002"]
    assert all(all_finite(tensors.values()) for tensors in saved.values())


def test_the_save_path_refuses_non_finite_weights(tmp_path):
    weights = {"w": torch.tensor([1.0, float("nan")])}
    with pytest.raises(TrainingDiverged, match="not finite"):
        save_checkpoint(tmp_path, 1, weights, {"optimizer": {}, "scheduler": {}}, {}, keep_last=2)
    assert not list(tmp_path.iterdir())


def test_the_weight_check_costs_little_on_a_tiny_step(tmp_path):
    trainer = Trainer(mlm_objective(), toy_data(), quick(steps=20), tmp_path)
    params = list(trainer.module.parameters())
    trainer.train_step()  # warm up

    def timed(fn, n=7):  # the fastest of n: other processes share the cores
        times = []
        for _ in range(n):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    check, step = timed(lambda: all_finite(params)), timed(trainer.train_step)
    assert check < 0.1 * step, (check, step)  # measured: 0.18 of 6.2 ms (3 %)


def test_divergence_through_the_cli_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "text.txt").write_text("".join(f"Sentence {i} of the text. Another one {i}.\n\n"
                                               for i in range(200)))
    out = tmp_path / "run"
    # lr=10 with weight_decay=10 multiplies the decayed weights by about -99 a step: the loss overflows
    # within a few steps (step 6 here), after some checkpoints were written
    args = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(out), "--steps", "12",
            "lr=10", "weight_decay=10", "save_every=1", "batch_size=4", "progress=false", "warmup=1",
            "n_layers=1", "d_model=32", "n_heads=2", "d_ff=64", "max_seq_len=64",
            "--data", str(tmp_path / "text.txt")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()  # the run's notes, then the error in one line, last
    lines = err.splitlines()
    assert "diverged" in lines[-1] and sum("diverged" in x for x in lines) == 1 and "Traceback" not in err
    saved = sorted(out.glob("checkpoints/step-*"))
    assert saved and err.endswith("last good checkpoint: " + str(saved[-1])), err
    assert all(all_finite(tensors.values()) for tensors in _all_saved_weights(out).values())
    assert not (out / "final").exists()


def _no_space(*args, **kw):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_named_the_partial_checkpoint_removed_and_the_previous_kept(tmp_path, monkeypatch):
    data = toy_data()
    trainer = Trainer(mlm_objective(), data, quick(steps=4, save_every=2), tmp_path)
    real = checkpoint.save_file

    def full_after_first(tensors, path, *args, **kw):
        if "step-0000004" in str(path):
            _no_space()
        return real(tensors, path, *args, **kw)

    monkeypatch.setattr(checkpoint, "save_file", full_after_first)
    with pytest.raises(DiskFull) as caught:
        trainer.fit()
    message = str(caught.value)
    assert message.startswith("no space left on device writing ") and "step-0000004" in message
    assert "step-0000002 is kept" in message and "\n" not in message
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-0000002"]  # no partial .step-0000004.tmp left behind
    read_checkpoint(tmp_path / "checkpoints" / "step-0000002")  # intact: passes its checksums


def test_a_full_disk_writing_the_optimiser_state_is_named_too(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.torch, "save", _no_space)
    with pytest.raises(DiskFull, match="no space left on device writing .*step-0000001"):
        save_checkpoint(tmp_path, 1, {"w": torch.ones(2)}, {"optimizer": {}, "scheduler": {}}, {},
                        keep_last=2)
    assert not list(tmp_path.iterdir())
