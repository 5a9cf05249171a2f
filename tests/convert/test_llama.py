"""Llama-layout configs: fields the reference ignores load, as it loads them."""
import pytest
import torch

import lmforge

transformers = pytest.importorskip("transformers")


def test_a_config_with_pretraining_tp_loads_with_the_references_logits(tmp_path):
    """pretraining_tp=2 (some Llama 2 configs) was refused, though it changes no output of the reference."""
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64, pretraining_tp=2)).eval()
    reference.save_pretrained(tmp_path)
    ids = torch.randint(0, 99, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(lmforge.load(tmp_path)(ids).logits, reference(ids).logits,
                                   atol=1e-5, rtol=1e-4)


def _saved(path, **config):
    """A tiny reference Llama saved with `config` merged into its config.json; (it as the reference then
    loads it, ids of 40 tokens, long enough for a rotary scale to show)."""
    import json

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64)).save_pretrained(path)
    stored = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**stored, **config}))
    ids = torch.randint(0, 99, (1, 40), generator=torch.Generator().manual_seed(1))
    return transformers.LlamaForCausalLM.from_pretrained(path).eval(), ids


def test_rope_scaling_added_to_a_newer_config_replaces_its_rope_parameters_as_in_the_reference(tmp_path):
    """rope_parameters' default won over an added linear rope_scaling: positions unscaled, logits off."""
    reference, ids = _saved(tmp_path, rope_scaling={"type": "linear", "factor": 4.0})
    model = lmforge.load(tmp_path)
    assert model.config.rotary_scaling == "linear" and model.config.rotary_scaling_factor == 4.0
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("config, match", [
    # at the top level it was ignored unsaid, where inside rope_parameters it is refused (references differ)
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5 is not supported"),
    ({"rope_scaling": "linear"}, "rope_scaling must be a mapping"),  # was a TypeError traceback
    ({"rope_parameters": {"rope_type": "linear", "factor": "4"}},
     "rope_parameters's factor must be a number")])
def test_rope_settings_lmforge_cannot_apply_are_refused_naming_them(tmp_path, config, match):
    from lmforge.io import CheckpointError

    _saved(tmp_path)
    import json

    stored = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**stored, **config}))
    with pytest.raises(CheckpointError, match=match) as refused:
        lmforge.load(tmp_path)
    assert "\n" not in str(refused.value)
