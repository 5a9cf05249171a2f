"""T5's feed-forward activation is read as the reference applies it: stored dense_act_fn and is_gated_act."""
import json

import pytest
import torch

import lmforge

transformers = pytest.importorskip("transformers")


def _saved(path, **config):
    """A tiny T5 saved with `config` merged into its config.json; (the reference as it loads there, ids)."""
    torch.manual_seed(0)
    reference = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0,
        feed_forward_proj="gated-gelu" if config.get("is_gated_act") else "relu"))
    reference.save_pretrained(path)
    stored = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**stored, **config}))
    ids = torch.randint(2, 99, (2, 7), generator=torch.Generator().manual_seed(1))
    return transformers.T5ForConditionalGeneration.from_pretrained(path).eval(), ids


@pytest.mark.parametrize("config", [
    {"feed_forward_proj": "gated-gelu", "dense_act_fn": "gelu", "is_gated_act": True},  # exact GELU, gated
    {"feed_forward_proj": "gated-gelu", "dense_act_fn": "gelu_new", "is_gated_act": True},
    {"feed_forward_proj": "gated-gelu", "is_gated_act": True},  # older files: gelu_new, derived
    {"feed_forward_proj": "gelu", "dense_act_fn": "gelu"},
])
def test_the_activation_the_reference_applies_is_the_one_loaded_and_exported(tmp_path, config):
    """A gated exact GELU (dense_act_fn 'gelu') was loaded as the tanh one."""
    reference, ids = _saved(tmp_path / "in", **config)
    model = lmforge.load(tmp_path / "in")
    with torch.no_grad():
        want = reference(ids, decoder_input_ids=ids[:, :4]).logits
        torch.testing.assert_close(model(ids, decoder_input_ids=ids[:, :4]).logits, want,
                                   atol=1e-5, rtol=1e-4)
        model.save(tmp_path / "out", format="hf")
        back = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
        torch.testing.assert_close(back(ids, decoder_input_ids=ids[:, :4]).logits, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("config, field", [
    ({"feed_forward_proj": "relu", "dense_act_fn": "gelu_new"}, "dense_act_fn"),  # was read as ReLU
    ({"feed_forward_proj": "gelu", "dense_act_fn": "relu"}, "dense_act_fn"),  # was read as GELU
    ({"feed_forward_proj": "relu", "is_gated_act": True}, "is_gated_act"),
    ({"feed_forward_proj": "quick_gelu", "dense_act_fn": "quick_gelu"}, "feed_forward_proj"),
    ({"feed_forward_proj": "gated-relu", "is_gated_act": True}, "feed_forward_proj")])
def test_an_activation_lmforge_lacks_or_fields_that_disagree_are_refused_naming_them(tmp_path, config, field):
    """The reference applies dense_act_fn and is_gated_act where stored: one that disagrees with
    feed_forward_proj was loaded as feed_forward_proj says, logits off by 0.5."""
    from lmforge.io import CheckpointError

    torch.manual_seed(0)
    transformers.T5Model(transformers.T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                               num_heads=4)).save_pretrained(tmp_path)
    stored = {k: v for k, v in json.loads((tmp_path / "config.json").read_text()).items()
              if k not in ("dense_act_fn", "is_gated_act")}
    (tmp_path / "config.json").write_text(json.dumps({**stored, **config}))
    with pytest.raises(CheckpointError, match=f"{field}=.*") as refused:
        lmforge.load(tmp_path)
    assert "\n" not in str(refused.value)
