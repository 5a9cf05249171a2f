"""Resuming: checksummed checkpoints, a refusal when none is usable or the run differs, and which
options a resumed run keeps."""
import json
import shutil

import pytest
import torch

from lmforge.train import Trainer
from lmforge.train.checkpoint import CheckpointCorrupt, read_checkpoint
from lmforge.train.config import RUN_OPTIONS, resumed_config
from lmforge.train.log import read_metrics
from lmforge.train.optimizer_fit import optimizer_change
from tests.train.helpers import clm_objective, interrupt_after, mlm_objective, quick, toy_data


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-step run with checkpoints at steps 2 and 4, trained once for the module."""
    out = tmp_path_factory.mktemp("finished")
    Trainer(mlm_objective(), toy_data(), quick(steps=4, save_every=2, keep_last=3), out).fit()
    return out


@pytest.fixture
def run(finished, tmp_path):
    """A copy of the finished run (its files hold no path of their own) for a test to damage or extend."""
    shutil.copytree(finished, tmp_path, dirs_exist_ok=True)
    return tmp_path


def _snapshot(out):
    return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and "final" not in p.parts and p.suffix != ".png"}


def test_checkpoints_record_the_checksums_of_their_files(run):
    info = json.loads((run / "checkpoints" / "step-0000004" / "trainer.json").read_text())
    assert set(info["sha256"]) == {"model.safetensors", "optimizer.pt"}
    assert info["objective"] == "mlm" and info["model"]["n_layers"] == 2


def test_a_flipped_byte_fails_the_checksum_and_the_previous_checkpoint_is_used(run):
    weights = run / "checkpoints" / "step-0000004" / "optimizer.pt"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, still a readable file perhaps: only the checksum tells
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupt, match="optimizer.pt does not match its checksum"):
        read_checkpoint(weights.parent)
    messages = []
    trainer = Trainer(mlm_objective(), toy_data(), quick(steps=4), run, log=messages.append)
    assert trainer.resume() and trainer.step == 2
    assert messages[0].startswith("warning:") and "step-0000004" in messages[0]


def test_resume_refuses_when_no_checkpoint_is_usable_and_touches_nothing(run):
    for path in (run / "checkpoints").glob("step-*/model.safetensors"):
        path.write_bytes(path.read_bytes()[:100])
    before = _snapshot(run)
    trainer = Trainer(mlm_objective(), toy_data(), quick(steps=4), run, log=lambda m: None)
    with pytest.raises(CheckpointCorrupt, match="no usable checkpoint .*refusing to start over") as refused:
        trainer.fit(resume=True)
    assert _snapshot(run) == before and len(read_metrics(run / "metrics.jsonl")) == 4
    # what is wrong is in the error itself, not only in the warnings (the log, here silent; stdout on the CLI)
    said = str(refused.value)
    assert "the newest: checkpoint " in said and "step-0000004" in said and "model.safetensors" in said, said
    assert "\n" not in said and said.endswith("choose another out (--out)")  # the field, not --out alone


def test_resume_of_another_model_or_objective_names_what_differs(run):
    bigger = Trainer(mlm_objective(n_layers=3), toy_data(), quick(steps=4), run)
    with pytest.raises(ValueError, match="another model or objective: n_layers=2 .*vs 3") as refused:
        bigger.resume()
    assert str(refused.value).endswith("choose another out (--out)")  # the field, not --out alone
    causal = Trainer(clm_objective(), toy_data(), quick(steps=4), run)
    with pytest.raises(ValueError, match="objective 'mlm' \\(the run's\\) vs 'clm'"):
        causal.resume()


def test_schedule_options_are_kept_from_the_run_and_said_so(run):
    shutil.rmtree(run / "checkpoints" / "step-0000004")  # killed after step 2: steps 3 and 4 are redone
    messages = []
    changed = quick(steps=4, lr=5e-2, batch_size=2, log_every=3, keep_last=1)
    trainer = Trainer(mlm_objective(), toy_data(), changed, run, log=messages.append)
    trainer.fit(resume=True)
    line = next(m for m in messages if m.startswith("resumed from"))
    assert "\n" not in line and "kept from the run: " in line and "taken from the command line: " in line
    assert "lr=0.05 (the run's: 0.001)" in line and "batch_size=2 (the run's: 4)" in line
    assert (trainer.cfg.lr, trainer.cfg.batch_size, trainer.cfg.log_every) == (1e-3, 4, 3)
    assert trainer.batches.batch_size == 4 and trainer.optimizer.param_groups[0]["initial_lr"] == 1e-3
    written = json.loads((run / "checkpoints" / "step-0000004" / "trainer.json").read_text())["train"]
    assert (written["lr"], written["batch_size"], written["log_every"]) == (1e-3, 4, 3)


def test_resumed_config_keeps_exactly_the_run_options():
    cfg, line = resumed_config(quick(lr=0.5, eval_every=7), {**quick().to_dict(), "eval_every": 0})
    assert cfg.lr == quick().lr and cfg.eval_every == 7
    assert all(getattr(cfg, k) == getattr(quick(), k) for k in RUN_OPTIONS)
    assert "ignored: lr=0.5" in line and "eval_every" in line.split("taken from the command line: ")[1]
    longer, line = resumed_config(quick(steps=12), quick(steps=6).to_dict())  # extending a finished run
    assert longer.steps == 12 and "steps=12 (the run's: 6): the linear decay now spans 12" in line


def test_resume_on_other_training_data_is_refused_and_on_the_same_data_goes_on(run):
    data = toy_data()
    info = json.loads((run / "checkpoints" / "step-0000004" / "trainer.json").read_text())
    assert info["data"]["examples"] == len(data) and len(info["data"]["sha256"]) == 64
    edited = list(data)
    edited[3] = edited[4]  # one example changed: the same count, other batches
    for other, said in ((edited, f"the same {len(data)} examples in count"),
                        (data[:-1], f"{len(data)} examples \\(the run's\\) vs {len(data) - 1} \\(now\\)")):
        with pytest.raises(ValueError, match=f"trained on other data \\({said}, their contents differ\\)"
                                             ".* choose another out \\(--out\\)$"):
            Trainer(mlm_objective(), other, quick(steps=4), run).resume()
    assert Trainer(mlm_objective(), toy_data(), quick(steps=4), run, log=lambda m: None).resume()


def test_a_resume_that_trains_other_parameters_or_lrs_is_refused_naming_optimizer_pt_and_loads_nothing(run):
    """The optimiser state loads without strict (a parameter that never had a gradient has none), so a
    run resumed with other parameters frozen (freeze_*) or other lr groups (layer_decay) must be told
    before it loads the run's state in part."""
    frozen = mlm_objective(seed=5)
    frozen.model.tokens.weight.requires_grad_(False)
    before = {k: v.clone() for k, v in frozen.state_dict().items()}
    with pytest.raises(ValueError, match="step-0000004: its optimizer.pt does not fit this run's optimiser "
                                         "\\(1 parameters trained by the run, not now \\(e.g. model.tokens"
                                         ".* choose another out \\(--out\\)$"):
        Trainer(frozen, toy_data(), quick(steps=4), run).resume()
    assert all(torch.equal(v, before[k]) for k, v in frozen.state_dict().items())  # nothing loaded
    scaled = Trainer(mlm_objective(), toy_data(), quick(steps=4), run,
                     lr_scale=lambda name, p: 0.5 if "blocks.0." in name else 1.0)
    with pytest.raises(ValueError, match="optimizer.pt does not fit .*2 parameter groups \\(the run's\\) vs"):
        scaled.resume()


def test_an_optimizer_state_of_another_shape_or_parameter_is_named():
    now = {"param_groups": [{"params": ["w"], "initial_lr": 1e-3}], "state": {}}
    state = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(2, 2)}
    saved = {"param_groups": [{"params": ["w"], "initial_lr": 1e-3}], "state": {"w": state}}
    assert optimizer_change(saved, now, {"w": (2, 2)}) == "w's exp_avg of shape (3,), not its (2, 2)"
    assert "a state for v" in optimizer_change({**saved, "state": {"v": state}}, now, {"w": (2, 2)})
    assert "lr 0.01 (the run's) vs 0.001 (now)" in optimizer_change(
        {**saved, "param_groups": [{"params": ["w"], "initial_lr": 1e-2}], "state": {}}, now, {})
    assert optimizer_change([], now, {}) == "it holds no optimiser state of parameter groups"
    assert optimizer_change({**saved, "state": {}}, now, {}) is None


def test_a_resume_with_other_static_masking_or_job_settings_is_refused_naming_them(run):
    with pytest.raises(ValueError, match="or objective: duplication=0 \\(the run's\\) vs 3 \\(now\\)"):
        Trainer(mlm_objective(), toy_data(), quick(steps=4), run, duplication=3).resume()
    Trainer(mlm_objective(), toy_data(), quick(steps=2), run / "other", settings={"alpha": 0.5}).fit()
    with pytest.raises(ValueError, match="alpha=0.5 \\(the run's\\) vs 0.7 \\(now\\)"):
        Trainer(mlm_objective(), toy_data(), quick(steps=4), run / "other", settings={"alpha": 0.7}).resume()


def test_a_resume_with_another_number_of_processes_is_refused_naming_both(run):
    """Rank r's micro-batches and dropout are drawn by rank and world size (train/data.py): a run of two
    processes resumed by one would see other batches, not go on as it would have."""
    from lmforge.utils.checksum import sign

    path = run / "checkpoints" / "step-0000004" / "trainer.json"
    info = {k: v for k, v in json.loads(path.read_text()).items() if k != "state_sha256"}
    path.write_text(json.dumps(sign({**info, "world": 2}, "state_sha256")))  # as a 2-process run wrote it
    with pytest.raises(ValueError, match="step-0000004: it was trained with .*: 2 processes \\(the run's\\)"):
        Trainer(mlm_objective(), toy_data(), quick(steps=4), run).resume()


def _unverified(checkpoint, **fields):
    """Rewrite a checkpoint's trainer.json as one written before the checksums, with `fields` changed."""
    path = checkpoint / "trainer.json"
    info = {k: v for k, v in json.loads(path.read_text()).items() if k not in ("sha256", "state_sha256")}
    path.write_text(json.dumps({**info, **fields}))


@pytest.mark.parametrize("key, value", [("step", "abc"), ("step", -1), ("step", True), ("world", 0),
                                        ("train", "lr"), ("settings", [1]), ("stopped", "no")])
def test_an_unverified_trainer_json_of_wrong_types_is_refused_naming_the_file_and_field(run, key, value):
    checkpoint = run / "checkpoints" / "step-0000004"
    _unverified(checkpoint, **{key: value})
    with pytest.raises(CheckpointCorrupt, match=f"step-0000004: trainer.json's {key} is "):
        read_checkpoint(checkpoint)


def test_unverified_training_options_no_run_had_are_refused_naming_the_checkpoint(run):
    checkpoint = run / "checkpoints" / "step-0000004"
    _unverified(checkpoint,
                train={**json.loads((checkpoint / "trainer.json").read_text())["train"], "lr": -3})
    trainer = Trainer(mlm_objective(), toy_data(), quick(steps=4), run, log=lambda m: None)
    with pytest.raises(CheckpointCorrupt, match="step-0000004: trainer.json's training options: .*lr"):
        trainer.resume()


def test_a_checkpoint_folder_renamed_to_another_step_is_refused_and_the_true_newest_resumed(run):
    checkpoints = run / "checkpoints"
    (checkpoints / "step-0000002").rename(checkpoints / "step-0000009")  # would be taken as the newest
    with pytest.raises(CheckpointCorrupt, match="step-0000009: trainer.json is of step 2, not 9"):
        read_checkpoint(checkpoints / "step-0000009")
    said = []
    trainer = Trainer(mlm_objective(), toy_data(), quick(steps=4), run, log=said.append)
    assert trainer.resume() and trainer.step == 4
    assert said[0].startswith("warning:") and "step-0000009" in said[0]


@pytest.mark.parametrize("key, value, said", [
    ("rng", {"torch": torch.zeros(3, dtype=torch.uint8)}, "RNG states cannot be set"),
    ("rng", {"python": torch.zeros(2)}, "RNG states cannot be set"),
    ("scheduler", [1], "scheduler state holds no step count"),
    ("scheduler", {"last_epoch": "3"}, "scheduler state holds no step count")])
def test_unverified_rng_or_schedule_states_that_cannot_be_set_are_refused_naming_the_file(run, key, value,
                                                                                          said):
    checkpoint = run / "checkpoints" / "step-0000004"
    _unverified(checkpoint)
    saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    changed = {**saved[key], **value} if isinstance(value, dict) and key == "rng" else value
    torch.save({**saved, key: changed}, checkpoint / "optimizer.pt")
    before = torch.get_rng_state()
    with pytest.raises(CheckpointCorrupt, match=f"step-0000004: optimizer.pt's {said}"):
        read_checkpoint(checkpoint)
    assert torch.equal(torch.get_rng_state(), before)  # tried and undone


def _with_idle_head(seed=0):
    """The tiny MLM objective with a head the loss never reads: a trained parameter without a gradient."""
    from lmforge.heads import attach

    objective = mlm_objective(seed)
    torch.manual_seed(seed + 1)
    attach(objective.model, "classification", name="idle", n_labels=2)
    return objective


def test_a_resumed_run_gives_a_parameter_without_gradients_no_optimizer_state(tmp_path):
    """torch's loading gave every parameter state by a zero-gradient step (step 1): the resumed run's
    optimizer.pt held Adam state for an idle head that the run straight through never had."""
    Trainer(_with_idle_head(), toy_data(), quick(steps=6, save_every=3), tmp_path / "straight").fit()
    interrupt_after(Trainer(_with_idle_head(), toy_data(), quick(steps=6, save_every=3), tmp_path / "cut"), 3)
    Trainer(_with_idle_head(), toy_data(), quick(steps=6, save_every=3), tmp_path / "cut").fit(resume=True)
    states = [torch.load(out / "checkpoints" / "step-0000006" / "optimizer.pt", weights_only=False)
              for out in (tmp_path / "straight", tmp_path / "cut")]
    held = [set(s["optimizer"]["state"]) for s in states]
    assert held[0] == held[1] and not any("idle" in name for name in held[0])
    for name in held[0]:
        for key, value in states[0]["optimizer"]["state"][name].items():
            assert torch.equal(value, states[1]["optimizer"]["state"][name][key]), (name, key)


def test_resuming_a_finished_run_says_so_and_trains_nothing(run):
    """It said only "resumed from ...", and then wrote its final files and evaluation again."""
    messages = []
    trainer = Trainer(mlm_objective(), toy_data(), quick(steps=4), run, log=messages.append)
    trainer.fit(resume=True)
    assert trainer.step == 4 and len(read_metrics(run / "metrics.jsonl")) == 4
    resumed = next(m for m in messages if m.startswith("resumed from"))
    assert resumed.endswith("the run had reached its last step: nothing more is trained"), resumed
