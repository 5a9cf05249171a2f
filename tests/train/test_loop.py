import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import lmforge
from lmforge.objectives import CausalLM
from lmforge.train import Trainer, TrainingDiverged
from lmforge.train.log import read_metrics

from tests.train.helpers import clm_objective, interrupt_after, mlm_objective, quick, toy_data


def _weights(model):
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}  # a GPU run's too


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_loss_falls_and_outputs_are_written(tmp_path):
    data = toy_data()
    model = Trainer(clm_objective(), data, quick(steps=30, lr=5e-3, eval_every=10, log_every=5), tmp_path,
                    eval_data=data[:8]).fit()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[-1]["step"] == 30 and records[-1]["loss"] < records[0]["loss"] - 0.3
    assert [r["step"] for r in records if "eval_loss" in r] == [10, 20, 30]
    assert {"lr", "grad_norm", "tokens_per_s", "perplexity"} <= set(records[0])
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert "lm" in model.heads and (tmp_path / "final" / "model.safetensors").is_file()
    again = lmforge.load(tmp_path / "final")
    assert_same_weights(_weights(again), _weights(model))


def test_resume_continues_exactly(tmp_path):
    data = toy_data()
    full = _weights(Trainer(mlm_objective(), data, quick(steps=8), tmp_path / "a").fit())
    interrupt_after(Trainer(mlm_objective(), data, quick(steps=8, save_every=1), tmp_path / "b"), 5)
    resumed = Trainer(mlm_objective(seed=5), data, quick(steps=8, save_every=1), tmp_path / "b")
    assert_same_weights(_weights(resumed.fit(resume=True)), full)
    steps = [r["step"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl")]
    assert steps == list(range(1, 9))


def test_a_resumed_runs_checkpoint_is_byte_identical_to_the_run_straight_through(tmp_path):
    """The optimiser's groups come back from a checkpoint with betas as a tuple, as a fresh run has them
    (torch's loader gives a list): the next checkpoint's files, not only its numbers, are the same."""
    data = toy_data()
    Trainer(mlm_objective(), data, quick(steps=4, save_every=2), tmp_path / "a").fit()
    interrupt_after(Trainer(mlm_objective(), data, quick(steps=4, save_every=2), tmp_path / "b"), 3)
    Trainer(mlm_objective(), data, quick(steps=4, save_every=2), tmp_path / "b").fit(resume=True)
    for name in ("model.safetensors", "optimizer.pt", "trainer.json"):
        straight, resumed = (tmp_path / run / "checkpoints" / "step-0000004" / name for run in "ab")
        assert resumed.read_bytes() == straight.read_bytes(), name


def test_resume_is_exact_with_a_trained_parameter_that_never_has_a_gradient(tmp_path):
    """Adam keeps no state for a parameter no loss reaches (an unused head, XLNet's segment bias under
    PLM): the checkpoint has none for it either, and the resumed run goes on as the whole run did."""
    def objective(seed=0):
        made = mlm_objective(seed)
        made.model.unused = torch.nn.Parameter(torch.ones(3))  # trained, but in no loss
        return made

    data = toy_data()
    full = _weights(Trainer(objective(), data, quick(steps=6), tmp_path / "a").fit())
    interrupt_after(Trainer(objective(), data, quick(steps=6, save_every=1), tmp_path / "b"), 3)
    resumed = Trainer(objective(seed=5), data, quick(steps=6, save_every=1), tmp_path / "b").fit(resume=True)
    assert_same_weights(_weights(resumed), full)
    assert torch.equal(resumed.unused, torch.ones(3))


def _causal_lm_without_dropout():
    torch.manual_seed(0)
    return CausalLM(lmforge.build(lmforge.tiny("gpt2"), dropout=0.0, attention_dropout=0.0))


def test_accumulation_equals_one_big_batch(tmp_path):
    # equal lengths: every micro-batch has as many loss tokens, so the mean of the two micro-batch
    # means is the mean over the big batch and the gradients agree up to float rounding
    data = [{"input_ids": [1, *(5 + (s + i) % 94 for i in range(10)), 2]} for s in range(0, 96, 2)]
    # one step at full lr; eps=1 makes AdamW's first update about lr * gradient (with the default eps it
    # is lr * sign(gradient), which would hide a wrong gradient)
    step = dict(steps=1, warmup=0, lr=1.0, eps=1.0, clip=None)
    start = _weights(_causal_lm_without_dropout().model)
    one = Trainer(_causal_lm_without_dropout(), data, quick(batch_size=8, **step), tmp_path / "a")
    two = Trainer(_causal_lm_without_dropout(), data, quick(batch_size=4, accumulation=2, **step),
                  tmp_path / "b")
    half = Trainer(_causal_lm_without_dropout(), data, quick(batch_size=4, **step), tmp_path / "c")
    a = torch.cat([b["input_ids"].flatten() for b in two.batches.micro_batches(0)]).sort().values
    assert torch.equal(a, one.batches.micro_batches(0)[0]["input_ids"].flatten().sort().values)  # the same 8
    big, accumulated, alone = (_weights(t.fit()) for t in (one, two, half))
    moved = 0.0
    for k in big:
        torch.testing.assert_close(accumulated[k], big[k], atol=2e-6, rtol=1e-5, msg=k)
        moved = max(moved, float((big[k] - start[k]).abs().max()))
    assert moved > 1e-3  # the step changed the weights ...
    # ... by the whole batch's gradient: half of the batch alone moves them elsewhere
    assert any(not torch.allclose(alone[k], big[k], atol=1e-4) for k in big)


def test_existing_checkpoints_are_not_overwritten_without_resume(tmp_path):
    """Refused as every refusal of out is (it was a plain FileExistsError): typed, one line, naming out."""
    from lmforge.utils.atomic import UnsafePath

    Trainer(mlm_objective(), toy_data(), quick(steps=2), tmp_path).fit()
    with pytest.raises(UnsafePath) as err:
        Trainer(mlm_objective(), toy_data(), quick(steps=2), tmp_path).fit()
    assert str(err.value) == (f"out {tmp_path} already holds a run's checkpoints: pass resume=True "
                              "(--resume) to continue it, or another folder") and err.value.field == "out"


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    objective = mlm_objective()
    trainer = Trainer(objective, toy_data(), quick(steps=6, save_every=2), tmp_path)
    original = objective.forward

    def poisoned(batch):
        out = original(batch)
        if trainer.step == 3:
            out.loss = out.loss * float("nan")
        return out

    objective.forward = poisoned
    with pytest.raises(TrainingDiverged, match="step 4.*step-0000002"):
        trainer.fit()
    names = [p.name for p in (tmp_path / "checkpoints").iterdir()]
    assert names == ["step-0000002"]
    assert all(torch.isfinite(p).all() for p in objective.parameters())


def test_corrupt_checkpoint_is_refused_and_the_previous_one_used(tmp_path):
    data = toy_data()
    Trainer(mlm_objective(), data, quick(steps=4, save_every=2, keep_last=3), tmp_path).fit()
    newest = tmp_path / "checkpoints" / "step-0000004" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:100])
    messages = []
    trainer = Trainer(mlm_objective(), data, quick(steps=4), tmp_path, log=messages.append)
    assert trainer.resume() and trainer.step == 2
    assert "step-0000004" in messages[0] and "previous" in messages[0]


SCRIPT = textwrap.dedent("""
    import sys, time
    from lmforge.train import Trainer
    from tests.train.helpers import mlm_objective, quick, toy_data
    trainer = Trainer(mlm_objective(), toy_data(), quick(steps=40, save_every=1), sys.argv[1])
    trainer.fit()  # a fresh run (a resume needs a checkpoint to resume)
""")


# slow (a 40-step run twice and a process start): an exact resume is test_resume_continues_exactly's and a
# torn checkpoint test_corrupt_checkpoint_is_refused_and_the_previous_one_used's; CI runs this one too
@pytest.mark.slow
def test_sigkill_at_a_random_step_then_resume_is_bit_identical(tmp_path):
    data = toy_data()
    full = _weights(Trainer(mlm_objective(), data, quick(steps=40), tmp_path / "full").fit())
    run = tmp_path / "killed"
    paths = (os.getcwd(), os.environ.get("PYTHONPATH"))  # the caller's path too (lmforge from src/, say)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(run)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = int(torch.randint(3, 30, ()))
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        done = sorted((run / "checkpoints").glob("step-*")) if (run / "checkpoints").is_dir() else []
        if done and int(done[-1].name.split("-")[1]) >= target:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = Trainer(mlm_objective(seed=9), data, quick(steps=40, save_every=1), run).fit(resume=True)
    assert_same_weights(_weights(resumed), full)
    assert json.loads((run / "checkpoints" / "step-0000040" / "trainer.json").read_text())["step"] == 40


def test_bf16_autocast_trains_with_fp32_weights(tmp_path):
    objective = clm_objective()
    trainer = Trainer(objective, toy_data(), quick(steps=4, precision="bf16"), tmp_path)
    seen = []
    # projections run in bf16 (norms and the loss stay fp32 under autocast)
    objective.model.decoder.blocks[0].attn.qkv.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    trainer.fit()
    assert seen and all(d == torch.bfloat16 for d in seen)
    assert all(p.dtype == torch.float32 for p in objective.parameters())
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in read_metrics(tmp_path / "metrics.jsonl"))


def test_a_warmup_as_long_as_the_run_is_said_in_one_line_at_its_start(tmp_path):
    said = []
    Trainer(mlm_objective(), toy_data(16), quick(steps=2, warmup=100, lr=1e-3), tmp_path / "a",
            log=said.append).fit()
    assert said[0] == ("note: warmup=100 > steps=2: the learning rate rises for the whole run and never "
                       "reaches lr=0.001 (at most 1e-05)")
    from lmforge.train.optim import lr_factor

    assert 1e-3 * lr_factor(1, 100, 2, "linear") == pytest.approx(1e-5)  # the last update's, as it says
    said.clear()
    Trainer(mlm_objective(), toy_data(16), quick(steps=3, warmup=1), tmp_path / "b", log=said.append).fit()
    assert not [line for line in said if "warmup" in line]


def test_steps_are_a_loop_of_torch_adamw_and_the_reference_schedule(tmp_path):
    # warm-up then linear decay, decoupled decay but not on biases and norms (the reference Trainer's
    # name rule), clipping of the global norm before the step, accumulation as the mean over the step's
    # masked tokens (num_items_in_batch: the micro-batches hold unequal numbers of them)
    transformers = pytest.importorskip("transformers")
    from transformers.trainer_pt_utils import get_parameter_names

    objective = mlm_objective(dropout=0.0, attention_dropout=0.0)
    reference = copy.deepcopy(objective)
    cfg = quick(steps=5, warmup=2, batch_size=2, accumulation=2, clip=0.5, weight_decay=0.1, eps=1e-8,
                betas=(0.9, 0.98), device="cpu")
    trainer = Trainer(objective, toy_data(), cfg, tmp_path)
    batches = [trainer.batches.micro_batches(step) for step in range(cfg.steps)]
    ours = _weights(trainer.fit())
    norms = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
    decayed = set(get_parameter_names(reference, [torch.nn.LayerNorm], norms))
    named = list(reference.named_parameters())
    groups = [{"params": [p for n, p in named if n in decayed], "weight_decay": 0.1},
              {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, cfg.warmup, cfg.steps)
    tally = [[int((batch["labels"] != -100).sum()) for batch in micro] for micro in batches]
    assert any(len(set(counts)) > 1 for counts in tally)  # unequal in some step: the weighing is tested
    for micro, counts in zip(batches, tally):
        for batch, count in zip(micro, counts):
            (reference(batch).loss * count / sum(counts)).backward()
        assert torch.nn.utils.clip_grad_norm_(reference.parameters(), cfg.clip) > cfg.clip  # it clips
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    theirs = _weights(reference.finish())
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6, msg=name)


def test_each_logged_lr_is_the_one_its_steps_update_used(tmp_path):
    # each line said the next step's lr (0 after the last step of a linear decay)
    from lmforge.train.optim import lr_factor

    cfg = quick(steps=5, warmup=2, device="cpu")
    Trainer(mlm_objective(), toy_data(16), cfg, tmp_path).fit()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    used = [cfg.lr * lr_factor(step, 2, 5, "linear") for step in range(5)]
    assert [r["lr"] for r in rows] == pytest.approx(used, rel=1e-5, abs=1e-12)  # 6 digits logged
    assert used == pytest.approx([0.0, 5e-4, 1e-3, 1e-3 * 2 / 3, 1e-3 / 3])


def test_evaluation_weighs_each_batch_by_its_examples(tmp_path):
    # 10 held-out examples at batch_size 8: batches of 8 and 2. The mean of the two batch means gave the
    # 2 examples as much weight as the 8 (the reference Trainer averages over examples)
    data = toy_data()
    trainer = Trainer(clm_objective(), data, quick(steps=1, batch_size=8, eval_every=1), tmp_path,
                      eval_data=data[:10])
    assert [len(b["input_ids"]) for b in trainer.eval_set] == [8, 2]
    trainer.objective.eval()
    with torch.no_grad():
        losses = [float(trainer.objective(b).loss) for b in trainer.eval_set]
    assert trainer.evaluate()["eval_loss"] == pytest.approx((8 * losses[0] + 2 * losses[1]) / 10, rel=1e-6)
    assert abs(losses[0] - losses[1]) > 1e-3  # the weighting matters here


def test_a_trainer_says_when_its_eval_every_evaluates_nothing(tmp_path):
    said = []
    Trainer(clm_objective(), toy_data(8), quick(steps=1, warmup=0, eval_every=1), tmp_path / "a",
            log=said.append).fit()
    assert [line for line in said if "eval_every" in line] == [
        "note: eval_every=1 but the run has no held-out data (eval_data) nor evaluator: nothing is evaluated"]
    said.clear()
    Trainer(clm_objective(), toy_data(8), quick(steps=1, warmup=0, eval_every=1), tmp_path / "b",
            eval_data=toy_data(4), log=said.append).fit()
    assert not [line for line in said if "eval_every" in line]


def test_a_step_s_counted_gradients_are_divided_by_every_process_s_predictions(monkeypatch):
    """Two processes averaged by DDP (synced=2) holding 6 and 2 predictions: each gradient, a sum over this
    process's predictions, is scaled by 2 / 8, so the average over processes is the mean over all 8; with
    parallel="none" (synced=1) each process's gradient is its own mean."""
    from lmforge.train import speed

    monkeypatch.setattr(speed, "all_sum", lambda t: t + torch.tensor([4.0, 2.0], dtype=t.dtype))  # the other
    w = torch.nn.Parameter(torch.zeros(()))
    w.grad = torch.tensor(12.0)  # the sum over this process's 6 predictions (two micro-batches of 4 and 2)
    loss = speed.step_loss([torch.tensor(1.0), torch.tensor(0.5)], [4, 2], [w], synced=2)
    assert float(w.grad) == pytest.approx(12.0 * 2 / 8)
    assert float(loss) == pytest.approx((4 * 1.0 + 2 * 0.5 + 4.0) / 8)  # the other holds loss sum 4 over 2
    w.grad = torch.tensor(12.0)
    loss = speed.step_loss([torch.tensor(1.0), torch.tensor(0.5)], [4, 2], [w], synced=1)
    assert float(w.grad) == pytest.approx(12.0 / 6) and float(loss) == pytest.approx(5.0 / 6)
    w.grad = torch.tensor(12.0)  # an uncounted loss: the mean of the means, the gradients as they are
    assert float(speed.step_loss([torch.tensor(1.0), torch.tensor(0.5)], [None, None], [w], 2)) == 0.75
    assert float(w.grad) == 12.0


def test_a_run_with_an_evaluator_validates_a_tenth_of_its_steps_unless_told(tmp_path):
    calls = []
    trainer = Trainer(mlm_objective(), toy_data(), quick(steps=20), tmp_path / "a",
                      evaluator=lambda t: calls.append(t.step) or {})
    assert trainer.cfg.eval_every == 2
    trainer.fit()
    assert calls == list(range(2, 21, 2))
    plain = Trainer(mlm_objective(), toy_data(), quick(steps=20), tmp_path / "b")
    assert plain.cfg.eval_every == 0  # no evaluator: none, as before (pretraining's held-out data alone)
