"""FFN neuron pruning: removing units equals zeroing them, importance is the gate gradient, the
pruned model reloads, and `lmforge prune` reports before and after."""
import json

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.compress.ffn import ffn_importance, ffn_modules, prune_ffn
from lmforge.config import ConfigError
from lmforge.tasks.finetune import encode_split, fine_tuned_task
from tests.conftest import tiny_model
from tests.tasks.core import fine_tuned_sentiment


@pytest.mark.parametrize("name", ["bert-base", "llama-3.2-1b", "t5-small"])
def test_pruned_units_are_the_zeroed_units_and_the_model_reloads(tmp_path, name):
    model = tiny_model(name)
    ids = torch.randint(5, 99, (2, 10), generator=torch.Generator().manual_seed(0))
    kw = {"decoder_input_ids": ids[:, :5]} if model.config.architecture == "encoder-decoder" else {}
    importance = {k: torch.rand(m.down.in_features, generator=torch.Generator().manual_seed(1))
                  for k, m in ffn_modules(model).items()}
    hooks = []
    for key, m in ffn_modules(model).items():  # zero the units pruning will remove
        drop = importance[key] < importance[key].topk(32).values[-1]
        hooks.append(m.down.register_forward_pre_hook(lambda mod, a, d=drop: (a[0].masked_fill(d, 0.0),)))
    with torch.no_grad():
        zeroed = model(ids, **kw).last_hidden_state
    for h in hooks:
        h.remove()
    params = model.num_parameters()
    sizes = prune_ffn(model, importance, 0.5)
    assert set(sizes.values()) == {32} and model.num_parameters() < params
    with torch.no_grad():
        pruned = model(ids, **kw).last_hidden_state
    torch.testing.assert_close(pruned, zeroed, atol=1e-6, rtol=1e-5)
    model.save(tmp_path)
    again = lmforge.load(tmp_path).eval()
    assert again.config.ffn_sizes == model.config.ffn_sizes
    with torch.no_grad():
        assert torch.equal(again(ids, **kw).last_hidden_state, pruned)


def test_ffn_sizes_are_validated():
    cfg = lmforge.tiny("bert-base")
    with pytest.raises(ConfigError, match="ffn_sizes key"):
        cfg.replace(ffn_sizes={"decoder.0": 8})
    with pytest.raises(ConfigError, match="1..d_ff"):
        cfg.replace(ffn_sizes={"encoder.0": cfg.d_ff + 1})
    with pytest.raises(ConfigError, match="separate layers"):
        lmforge.tiny("albert-base").replace(ffn_sizes={"encoder.0": 8})


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    """A tiny BERT fine-tuned on the built-in sentiment task (saved with its task.json)."""
    return fine_tuned_sentiment(tmp_path_factory.mktemp("sst"))


def test_importance_is_the_gradient_of_a_unit_gate(fine_tuned):
    path, data = fine_tuned
    task = fine_tuned_task(path, data["validation"], device="cpu")  # the finite difference in CPU fp32
    examples = encode_split(task, data["validation"], "data")[:16]
    importance = ffn_importance(task, examples, batch_size=16)
    unit, eps = 5, 1e-3
    ffn = ffn_modules(task.model)["encoder.1"]
    batch = task.collate(examples)
    task.eval()
    losses = []
    for sign in (1, -1):
        scale = torch.ones(ffn.down.in_features)
        scale[unit] += sign * eps
        hook = ffn.down.register_forward_pre_hook(lambda m, a, s=scale: (a[0] * s,))
        with torch.no_grad():
            losses.append(float(task.forward(batch).loss))
        hook.remove()
    estimate = abs(losses[0] - losses[1]) / (2 * eps)
    assert abs(estimate - float(importance["encoder.1"][unit])) < 1e-2 * max(1.0, estimate)


def test_prune_command_writes_the_smaller_model_and_its_report(fine_tuned, tmp_path, capsys):
    path, data = fine_tuned
    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(json.dumps(r) + "\n" for r in data["validation"]))
    assert main(["prune", "--model", str(path), "--method", "ffn", "--sparsity", "0.5", "--data", str(dev),
                 "--out", str(tmp_path / "p")]) == 0
    report = json.loads((tmp_path / "p" / "prune.json").read_text())
    assert report["after"]["parameters"] < report["before"]["parameters"]
    assert report["after"]["bytes"] < report["before"]["bytes"]
    assert lmforge.load(tmp_path / "p" / "model").config.ffn_sizes == {"encoder.0": 32, "encoder.1": 32}
    assert "speed-up" in capsys.readouterr().out
    assert main(["prune", "--model", str(path), "--method", "ffn", "--sparsity", "1.2", "--data", str(dev),
                 "--out", str(tmp_path / "q")]) == 2


def test_flops_count_what_pruning_removed():
    from lmforge.compress.head_pruning import prune_heads
    from lmforge.pipelines.summary import flops_per_token

    model = tiny_model("bert-base")
    cfg = model.config
    full = flops_per_token(cfg, 16, lm_head=False)
    prune_heads(model, {"encoder.0": [1, 2]})
    d, dh, keys = cfg.d_model, cfg.head_dim, 16
    assert full - flops_per_token(model.config, 16, lm_head=False) == 2 * 2 * (4 * d * dh + 2 * keys * dh)
    prune_ffn(model, {k: torch.arange(m.down.in_features, dtype=torch.float)
                      for k, m in ffn_modules(model).items()}, 0.25)
    removed = 2 * (cfg.d_ff - 48) * d * 2
    assert full - flops_per_token(model.config, 16, lm_head=False) == \
        2 * 2 * (4 * d * dh + 2 * keys * dh) + 2 * removed


def test_an_int8_model_is_refused_not_pruned_into_one_that_will_not_load():
    from lmforge.compress.quantize import quantize

    model = quantize(tiny_model("bert-base"), alpha=None)
    importance = {k: torch.ones(m.down.in_features) for k, m in ffn_modules(model).items()}
    with pytest.raises(ValueError, match="int8-quantised .*prune the fp32 model"):
        prune_ffn(model, importance, 0.5)
    assert model.config.ffn_sizes is None


def test_a_model_whose_config_refuses_the_widths_is_left_untouched():
    """ALBERT's layers share one FFN, so per-layer widths are refused: the shared FFN was shrunk first and
    the model left at half its units under a config still saying d_ff, after the ConfigError."""
    model = lmforge.build(lmforge.tiny("albert-base"))
    modules = ffn_modules(model)
    before = {key: ffn.down.in_features for key, ffn in modules.items()}
    importance = {key: torch.arange(width, dtype=torch.float) for key, width in before.items()}
    with pytest.raises(ConfigError, match="separate layers"):
        prune_ffn(model, importance, 0.5)
    assert {key: ffn.down.in_features for key, ffn in ffn_modules(model).items()} == before
    assert model.config.ffn_sizes is None
