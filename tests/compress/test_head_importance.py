"""Head gates, importance (Michel et al. 2019), iterative pruning and physical pruning."""
import json

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.compress.head_importance import (CurveOptions, curve_band, full_gates, gates_at, head_importance,
                                              masked_heads, pruning_curve, random_curves)
from lmforge.compress.head_pruning import head_counts, prune_heads
from lmforge.config import ConfigError
from lmforge.convert import ConversionError
from lmforge.layers.inspection import inspecting
from lmforge.tasks.finetune import encode_split, fine_tuned_task
from tests.conftest import tiny_model
from tests.tasks.core import fine_tuned_sentiment

PRUNE = {"encoder": {"encoder.0": [1], "encoder.1": [0, 2]},
         "decoder": {"decoder.0": [1], "decoder.1": [0, 2]},
         "encoder-decoder": {"encoder.0": [1], "decoder.1": [0, 2], "cross.0": [3]}}


def _inputs(model):
    ids = torch.randint(5, 99, (2, 12), generator=torch.Generator().manual_seed(0))
    kw = {"decoder_input_ids": ids[:, :6]} if model.config.architecture == "encoder-decoder" else {}
    return ids, kw


def _gates_of(remove: dict, cfg) -> dict:
    gates = full_gates(cfg)
    for key, heads in remove.items():
        attention, _, layer = key.partition(".")
        gates[attention][int(layer)][heads] = 0.0
    return gates


@pytest.mark.parametrize("name", ["bert-base", "gpt2", "bart-base", "longformer-base", "bigbird-base"])
def test_physical_pruning_equals_masking_those_heads_and_reloads(tmp_path, name):
    model = tiny_model(name)
    ids, kw = _inputs(model)
    remove = PRUNE[model.config.architecture]
    with torch.no_grad(), inspecting(model, gates=_gates_of(remove, model.config)):
        masked = model(ids, **kw).last_hidden_state
    params = model.num_parameters()
    prune_heads(model, remove)
    with torch.no_grad():
        pruned = model(ids, **kw).last_hidden_state
    torch.testing.assert_close(pruned, masked, atol=1e-6, rtol=1e-5)
    assert model.num_parameters() < params
    model.save(tmp_path)
    again = lmforge.load(tmp_path).eval()
    assert again.config.pruned_heads == model.config.pruned_heads
    assert head_counts(again.config)[next(iter(remove))] == 3
    with torch.no_grad():
        assert torch.equal(again(ids, **kw).last_hidden_state, pruned)


def test_pruning_twice_names_heads_by_their_original_index():
    model = tiny_model("bert-base")
    ids, _ = _inputs(model)
    with torch.no_grad(), inspecting(model, gates=_gates_of({"encoder.0": [0, 3]}, model.config)):
        want = model(ids).last_hidden_state
    prune_heads(model, {"encoder.0": [3]})
    prune_heads(model, {"encoder.0": [0]})  # head 0 of the original four, now the first of three
    assert model.config.pruned_heads == {"encoder.0": [0, 3]}
    with torch.no_grad():
        torch.testing.assert_close(model(ids).last_hidden_state, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name,reason", [("t5-small", "per-head position"), ("llama-3.2-1b", "n_kv_heads"),
                                         ("albert-base", "separate layers")])
def test_models_that_cannot_be_pruned_physically_say_why(name, reason):
    model = tiny_model(name)
    key = f"{'encoder' if model.config.architecture != 'decoder' else 'decoder'}.0"
    with pytest.raises(ConfigError, match="mask those heads instead"):
        prune_heads(model, {key: [0]})


def test_config_refuses_bad_pruned_heads():
    base = lmforge.tiny("bert-base")
    for bad, match in (({"decoder.0": [0]}, "names no layer"), ({"encoder.9": [0]}, "names no layer"),
                       ({"encoder.0": [0, 1, 2, 3]}, "every head"), ({"encoder.0": [7]}, "distinct heads")):
        with pytest.raises(ConfigError, match=match):
            base.replace(pruned_heads=bad)


def test_a_pruned_model_refuses_hugging_face_export(tmp_path):
    model = prune_heads(tiny_model("bert-base"), {"encoder.1": [2]})
    with pytest.raises(ConversionError, match="pruned per layer"):
        model.save(tmp_path, format="hf")


def test_gates_mask_xlnet_query_stream_and_cross_attention_too():
    for name in ("xlnet-base", "t5-small"):
        model = tiny_model(name)
        ids, kw = _inputs(model)
        with torch.no_grad():
            plain = model(ids, **kw).last_hidden_state
            key = "cross" if kw else "encoder"
            with inspecting(model, gates=_gates_of({f"{key}.1": [0, 1, 2, 3]}, model.config)):
                gated = model(ids, **kw).last_hidden_state
        assert not torch.allclose(plain, gated)


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    """A tiny BERT fine-tuned on the built-in sentiment task (saved with its task.json)."""
    return fine_tuned_sentiment(tmp_path_factory.mktemp("sst"))


def test_importance_is_the_mean_absolute_gate_gradient(fine_tuned):
    path, data = fine_tuned
    task = fine_tuned_task(path, data["validation"])
    examples = encode_split(task, data["validation"], "data")[:16]
    raw = head_importance(task, examples, batch_size=16, normalise=False)["encoder"]
    # finite difference of the batch loss along one gate: |dL/dxi| at xi = 1
    gates, eps = full_gates(task.model.config), 1e-3
    batch = task.collate(examples)
    task.eval()
    losses = []
    for sign in (1, -1):
        gates["encoder"][1][2] = 1 + sign * eps
        with torch.no_grad(), inspecting(task.model, gates=gates):
            losses.append(float(task.forward(batch).loss))
    assert abs(abs(losses[0] - losses[1]) / (2 * eps) - float(raw[1][2])) < 1e-2 * max(1.0, float(raw[1][2]))
    normalised = head_importance(task, examples, batch_size=16)["encoder"]
    assert all(abs(float(layer.norm()) - 1) < 1e-5 for layer in normalised)


def test_importance_is_the_mean_over_batches_of_each_batch_s_absolute_gate_gradient(fine_tuned):
    # Michel et al.'s code: per batch |dL/dxi| of the batch's mean loss, summed, then L2 per layer; the gate
    # here is written apart from lmforge's, on the output projection's input (heads side by side)
    path, data = fine_tuned
    task = fine_tuned_task(path, data["validation"])
    examples = encode_split(task, data["validation"], "data")[:12]
    ours = head_importance(task, examples, batch_size=4)["encoder"]
    task.eval()
    blocks = task.model.encoder.blocks
    xis = [torch.ones(block.attn.n_heads, requires_grad=True) for block in blocks]
    hooks = [block.attn.out.register_forward_pre_hook(
        lambda mod, args, xi=xi: ((args[0].unflatten(-1, (len(xi), -1)) * xi[:, None]).flatten(-2),))
        for block, xi in zip(blocks, xis)]
    total = [torch.zeros_like(xi) for xi in xis]
    try:
        for start in range(0, 12, 4):
            task.forward(task.collate(examples[start:start + 4])).loss.backward()
            for acc, xi in zip(total, xis):
                acc += xi.grad.abs()
                xi.grad = None
    finally:
        for hook in hooks:
            hook.remove()
        task.model.zero_grad(set_to_none=True)
    for got, acc in zip(ours, total):
        torch.testing.assert_close(got, acc / acc.norm(), atol=1e-6, rtol=1e-5)


def test_pruning_curves_keep_a_head_per_layer_and_record_what_they_masked(fine_tuned):
    path, data = fine_tuned
    task = fine_tuned_task(path, data["validation"])
    examples = encode_split(task, data["validation"], "data")
    levels, gates = pruning_curve(task, (data["validation"], examples), examples,
                                  CurveOptions(order="importance", step=0.25, max_fraction=0.9))
    assert [lv["pruned"] for lv in levels] == [0, 2, 4, 6]  # 8 heads: a head per layer always stays
    assert all((g > 0).sum() >= 1 for g in gates["encoder"])
    again = gates_at(task.model.config, levels)
    assert all(torch.equal(a, b) for a, b in zip(again["encoder"], gates["encoder"]))
    assert sum(len(v) for v in masked_heads(gates, task.model.config).values()) == 6
    random_levels, _ = pruning_curve(task, (data["validation"], examples), examples,
                                     CurveOptions(order="random", step=0.25, seed=1))
    assert random_levels[0]["metric"] == levels[0]["metric"]
    # 0.3 x 8 heads = 2.4 and 0.19 x 8 = 1.52 a level: 2 and 1, as Michel et al.'s max(1, int(.)) counts
    for step, per_level in ((0.3, 2), (0.19, 1)):
        steps, _ = pruning_curve(task, (data["validation"], examples), examples,
                                 CurveOptions(order="random", step=step, seed=1, max_fraction=0.5))
        assert [lv["pruned"] for lv in steps][:2] == [0, per_level]


def _heads_command(fine_tuned, tmp_path, prune: str, orders: str) -> dict:
    """heads.json of `lmforge heads --prune PRUNE --step 0.25` on the validation split, which must succeed."""
    path, data = fine_tuned
    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(json.dumps(r) + "\n" for r in data["validation"]))
    assert main(["heads", "--model", str(path), "--data", str(dev), "--prune", prune, "--step", "0.25",
                 "--random-orders", orders, "--out", str(tmp_path / "heads")]) == 0
    return json.loads((tmp_path / "heads" / "heads.json").read_text())


def test_heads_command_prunes_physically_and_writes_its_report(fine_tuned, tmp_path, capsys):
    (tmp_path / "heads" / "pruned").mkdir(parents=True)
    (tmp_path / "heads" / "pruned" / "model.safetensors.stale").write_text("an earlier run's")
    report = _heads_command(fine_tuned, tmp_path, "0.25", "3")
    assert not (tmp_path / "heads" / "pruned" / "model.safetensors.stale").exists()  # replaced whole
    assert set(report["curves"]) == {"importance", "random"} and report["heads"] == 8
    band = report["random"]["band"]
    assert report["random"]["seeds"] == [0, 1, 2] and [b["n"] for b in band] == [3] * len(band)
    assert band[0]["sd"] == 0 and band[1]["metrics"][0] == report["curves"]["random"][1]["metric"]
    assert len(report["random"]["importance_vs_mean"]["margin"]) == len(band) - 1
    assert report["pruned"]["after"]["parameters"] < report["pruned"]["before"]["parameters"]
    assert report["pruned"]["asked"] == {"prune": 0.25} and report["pruned"]["level"]["fraction"] == 0.25
    timed = report["pruned"]["before"]["seconds"], report["pruned"]["after"]["seconds"]
    assert report["pruned"]["speedup"] == timed[0] / timed[1]
    assert (tmp_path / "heads" / "heads.png").stat().st_size > 10_000
    pruned = lmforge.load(tmp_path / "heads" / "pruned")
    assert sum(head_counts(pruned.config).values()) == 6
    levels = report["curves"]["importance"]  # each level lists the heads it masked anew; removed: all of them
    upto = next(i for i, lv in enumerate(levels) if lv == report["pruned"]["level"])
    assert report["pruned"]["removed"] == [h for lv in levels[1:upto + 1] for h in lv["masked"]]
    assert len(report["pruned"]["removed"]) == 8 - 6
    out = " ".join(capsys.readouterr().out.split())  # rich wraps lines at the terminal's width
    assert "head importance" in out and "0.2500 of the heads removed (--prune 0.25)" in out


@pytest.mark.parametrize("earlier", [False, True])
def test_heads_command_says_when_no_level_removes_a_head(fine_tuned, tmp_path, capsys, earlier):
    if earlier:  # a model an earlier run pruned would pass for this run's
        (tmp_path / "heads" / "pruned").mkdir(parents=True)
    pruned = _heads_command(fine_tuned, tmp_path, "0.1", "1")["pruned"]
    gone = f"; {tmp_path / 'heads' / 'pruned'} from an earlier run removed" if earlier else ""
    assert pruned["note"] == ("no heads removed at --prune 0.1: the curve's first level removes 0.2500 "
                              "of the heads" + gone)
    assert not (tmp_path / "heads" / "pruned").exists()
    assert pruned["note"] in capsys.readouterr().out.splitlines()  # one line, unwrapped


def test_heads_command_refuses_bad_options(fine_tuned, capsys):
    path, _ = fine_tuned
    assert main(["heads", "--model", str(path), "--data", "x.jsonl", "--prune", "1.5", "--out", "o"]) == 2
    err = capsys.readouterr().err
    assert "--prune 1.5" in err and err.count("\n") == 1
    with pytest.raises(SystemExit, match="2"):  # a count out of its bounds: argparse's one line
        main(["heads", "--model", str(path), "--data", "x.jsonl", "--random-orders", "0", "--out", "o"])
    assert "--random-orders 0: must be in [1, 1000]" in capsys.readouterr().err


def test_random_orders_band_is_the_mean_and_sd_of_seeded_orders(fine_tuned):
    path, data = fine_tuned
    task = fine_tuned_task(path, data["validation"])
    examples = encode_split(task, data["validation"], "data")
    curves = random_curves(task, (data["validation"], examples), 3, CurveOptions(step=0.25, seed=4))
    alone = pruning_curve(task, (data["validation"], examples), examples,
                          CurveOptions(order="random", step=0.25, seed=5))[0]
    assert [lv["masked"] for lv in curves[1]] == [lv["masked"] for lv in alone]  # order i is seed + i
    band = curve_band(curves)
    for level, b in enumerate(band):
        values = [c[level]["metric"] for c in curves]
        assert b["mean"] == pytest.approx(sum(values) / 3)
        assert b["sd"] == pytest.approx(float(torch.tensor(values).std()))
    assert len({tuple(map(tuple, c[1]["masked"])) for c in curves}) > 1  # the orders differ


@pytest.mark.parametrize("value", ["x", 3, ["encoder.0"]])
def test_pruned_heads_of_the_wrong_type_is_one_line_naming_the_field(value):
    from types import SimpleNamespace

    from lmforge.config.checks import validate_pruned

    with pytest.raises(ConfigError, match=r"^pruned_heads ") as err:
        validate_pruned(SimpleNamespace(pruned_heads=value))  # the check itself, whatever runs before it
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="pruned_heads"):
        lmforge.build("bert-base", n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=50,
                      pruned_heads=value)
