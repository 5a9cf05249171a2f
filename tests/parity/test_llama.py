import pytest
import torch

import lmforge
from lmforge.config import ConfigError
from lmforge.convert import load_hf
from tests.parity.helpers import (BEAM_VARIANTS, assert_beam_parity, assert_causal_lm_parity,
                                  assert_export_round_trip, assert_forward_parity, assert_greedy_parity,
                                  assert_load_refuses, assert_logits_and_loss_parity, left_padded_batch,
                                  load_reference, padded_batch, transformers)


def llama_config(**overrides):
    """A tiny Llama with grouped-query attention (4 query heads share 2 key/value heads)."""
    fields = {"vocab_size": 99, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
              "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 3}
    return transformers.LlamaConfig(**{**fields, **overrides})


def _pair(tmp_path, architecture="LlamaForCausalLM", **overrides):
    torch.manual_seed(0)
    reference = getattr(transformers, architecture)(llama_config(**overrides)).eval()
    return reference, load_reference(reference, tmp_path / "reference")


VARIANTS = [
    {},  # Llama 2/3 layout: untied, no biases
    # tied table, biases on q/k/v/o and the MLP, a head width that is not d_model / n_heads, theta
    {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True, "head_dim": 16,
     "rope_theta": 500000.0},
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_causal_lm_hidden_states_logits_and_loss(tmp_path, overrides):
    reference, model = _pair(tmp_path, **overrides)
    assert model.config.kv_heads == 2 and model.config.n_heads == 4
    ids, mask = padded_batch(99)
    assert_causal_lm_parity(model, reference, ids, mask)


def test_base_model_hidden_states(tmp_path):
    reference, model = _pair(tmp_path, "LlamaModel")
    assert_forward_parity(model, reference, *padded_batch(99, seed=1), "last_hidden_state")


def test_sequence_classification_scores_the_last_real_token(tmp_path):
    reference, model = _pair(tmp_path, "LlamaForSequenceClassification", num_labels=3)
    # the reference finds the last real token by pad id
    ids, mask = padded_batch(99, seed=2, pad=1)
    labels = torch.tensor([0, 2, 1])
    # the loss at assert_close's own float32 tolerances
    assert_logits_and_loss_parity(model, reference, ids, mask, labels, atol=1e-5, rtol=1.3e-6)


def test_token_classification(tmp_path):
    reference, model = _pair(tmp_path, "LlamaForTokenClassification", num_labels=5)
    assert_forward_parity(model, reference, *padded_batch(99, seed=3))


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "LlamaForSequenceClassification"])
def test_export_round_trip_of_an_imported_model(tmp_path, architecture):
    reference, model = _pair(tmp_path, architecture)
    ids, mask = padded_batch(99, seed=4, pad=1)
    assert_export_round_trip(model, type(reference), tmp_path / "hf", ids, mask, reference)


def test_export_of_the_tiny_preset(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("llama-3.2-1b")).eval()
    attach(model, "lm")
    ids, mask = padded_batch(99, seed=5)
    assert_export_round_trip(model, transformers.LlamaForCausalLM, tmp_path / "hf", ids, mask)


def test_greedy_generation_on_a_left_padded_batch(tmp_path):
    reference, model = _pair(tmp_path)
    ids, mask = left_padded_batch(99, pad=1)
    assert_greedy_parity(model, reference, ids, mask)


@pytest.mark.parametrize("options", BEAM_VARIANTS)
def test_beam_search_on_a_left_padded_batch(tmp_path, options):
    reference, model = _pair(tmp_path)
    assert_beam_parity(model, reference, *left_padded_batch(99, pad=1), **options)


# Llama 3.1's frequency bands at test size: with head_dim 8 and theta 10000 the wavelengths are
# about 6, 63, 628 and 6283 positions, so original 64 / high 4 = 16 and 64 / low 1 = 64 put
# frequencies in each of the kept, interpolated and stretched bands
SCALINGS = [{"rope_type": "linear", "factor": 2.0},
            {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 64}]


@pytest.mark.parametrize("scaling", SCALINGS)
def test_scaled_rope(tmp_path, scaling):
    reference, model = _pair(tmp_path, rope_scaling=scaling, max_position_embeddings=256)
    assert model.config.rotary_scaling == scaling["rope_type"]
    ids, mask = padded_batch(99, lengths=(40, 30, 9))
    assert_causal_lm_parity(model, reference, ids, mask)
    assert_export_round_trip(model, transformers.LlamaForCausalLM, tmp_path / "hf", ids, mask, reference)


@pytest.mark.parametrize("scaling", [{"rope_type": "dynamic", "factor": 2.0},
                                     {"rope_type": "yarn", "factor": 2.0}])
def test_other_rope_scalings_are_refused(tmp_path, scaling):
    reference = transformers.LlamaForCausalLM(llama_config(rope_scaling=scaling))
    assert_load_refuses(reference, tmp_path, ConfigError, "rope_scaling", load=load_hf)


def test_the_command_lines_greedy_text_is_the_references_after_the_bos_its_tokenizer_adds(tmp_path, capsys):
    """A Llama tokenizer puts <s> before the prompt, and the reference generates from it; `lmforge
    generate` had continued the bare text, so a converted Llama's greedy text silently differed."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers, processors

    from lmforge.cli import main

    words = [f"w{i}" for i in range(95)]
    vocab = {"<unk>": 0, "<pad>": 1, "<s>": 2, "</s>": 3, **{w: i + 4 for i, w in enumerate(words)}}
    backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                               unk_token="<unk>", pad_token="<pad>")
    torch.manual_seed(1)  # a model whose greedy text depends on the <s> (seed 0's does not)
    reference = transformers.LlamaForCausalLM(llama_config()).eval()
    load_reference(reference, tmp_path / "reference")
    tok.save_pretrained(tmp_path / "reference")
    prompt = "w5 w17 w3 w40"
    ids = tok(prompt, return_tensors="pt").input_ids
    assert ids[0, 0].item() == 2  # the reference's input starts with <s>

    def greedy(x):
        with torch.no_grad():
            return reference.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=6, do_sample=False,
                                      eos_token_id=None)[0, x.shape[1]:]
    new = greedy(ids)
    assert not torch.equal(new, greedy(ids[:, 1:]))  # so the bare text would have been told apart
    assert main(["generate", "--model", str(tmp_path / "reference"), prompt,
                 "--max-new-tokens", "6"]) == 0
    said = capsys.readouterr().out.strip()
    assert said == f"{prompt} {tok.decode(new)}"
