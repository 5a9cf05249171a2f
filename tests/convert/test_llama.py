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
        torch.testing.assert_close(lmforge.load(tmp_path)(ids).logits, reference(ids).logits, atol=1e-5, rtol=1e-4)
