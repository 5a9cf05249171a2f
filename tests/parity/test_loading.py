"""Reading reference directories: every weight layout, and every way one can be broken."""

import pytest
import torch

import lmforge
from lmforge.io import CheckpointError

from tests.parity.helpers import (assert_forward_parity, assert_load_refuses, padded_batch, save_reference,
                                  transformers)


@pytest.fixture
def reference():
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64)).eval()


def test_sharded_safetensors_with_an_index(tmp_path, reference):
    reference.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and \
        len(list(tmp_path.glob("*.safetensors"))) > 2
    assert_forward_parity(lmforge.load(tmp_path), reference, *padded_batch(99))


def test_pytorch_model_bin_is_read_without_unpickling_code(tmp_path, reference):
    save_reference(reference, tmp_path)
    from safetensors.torch import load_file

    torch.save(load_file(str(tmp_path / "model.safetensors")), tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink()
    assert_forward_parity(lmforge.load(tmp_path), reference, *padded_batch(99))


def test_a_pickle_that_runs_code_is_refused(tmp_path, reference):
    save_reference(reference, tmp_path)
    (tmp_path / "model.safetensors").unlink()

    class Exploit:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"x": Exploit()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="cannot read the weights"):
        lmforge.load(tmp_path)


def test_truncated_safetensors_is_refused(tmp_path, reference):
    save_reference(reference, tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="cannot read the weights"):
        lmforge.load(tmp_path)


def test_config_that_disagrees_with_the_weights_is_named(tmp_path, reference):
    match = "intermediate|ffn.up.weight"
    assert_load_refuses(reference, tmp_path, CheckpointError, match, intermediate_size=48)


def test_unsupported_family_is_named(tmp_path, reference):
    assert_load_refuses(reference, tmp_path, CheckpointError, "'mamba' is not supported", model_type="mamba")


def test_a_tensor_lmforge_cannot_place_is_named(tmp_path, reference):
    save_reference(reference, tmp_path)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["bert.encoder.extra.weight"] = torch.zeros(2)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="bert.encoder.extra.weight|encoder.extra.weight"):
        lmforge.load(tmp_path)


def test_truncated_safetensors_names_the_file_and_the_cause(tmp_path, reference):
    save_reference(reference, tmp_path)
    weights = tmp_path / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:size // 3])
    with pytest.raises(CheckpointError, match=f"{weights}: truncated: {size // 3} of {size} bytes"):
        lmforge.load(tmp_path)


def test_a_missing_shard_of_an_index_is_named(tmp_path, reference):
    reference.save_pretrained(tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"cannot read {shard}"):
        lmforge.load(tmp_path)


def _pooler_less_bert():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64)
    return transformers.BertModel(cfg, add_pooling_layer=False).eval()


def test_a_bert_model_saved_without_its_pooler_loads_and_exports(tmp_path):
    from tests.parity.helpers import assert_parity, assert_same_state_dict

    reference = _pooler_less_bert()
    model = lmforge.load(save_reference(reference, tmp_path / "in"))
    assert not model.heads
    ids, mask = padded_batch(99)
    with torch.no_grad():
        assert_parity(model(ids, mask).last_hidden_state,
                      reference(ids, attention_mask=mask).last_hidden_state, mask)
    model.save(tmp_path / "out", format="hf")
    back = transformers.BertModel.from_pretrained(tmp_path / "out", add_pooling_layer=False).eval()
    assert_same_state_dict(reference, back)
    assert_same_state_dict(model, lmforge.load(tmp_path / "out"))


@pytest.mark.parametrize("max_len,block_size", [(64, 64), (40, 16), (128, 64), (30, 8), (12, 64)])
def test_full_attention_big_bird_loads_at_any_size_and_block_size(tmp_path, max_len, block_size):
    from tests.parity.helpers import assert_parity

    torch.manual_seed(0)
    reference = transformers.BigBirdModel(transformers.BigBirdConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=max_len, attention_type="original_full", block_size=block_size)).eval()
    model = lmforge.load(save_reference(reference, tmp_path / "in"))
    ids, mask = padded_batch(99, (max_len, max_len - 5, 3))
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask)
    assert_parity(ours.last_hidden_state, theirs.last_hidden_state, mask)
    assert_parity(ours.head_outputs["pooler"], theirs.pooler_output)
    model.save(tmp_path / "out", format="hf")
    back = transformers.BigBirdModel.from_pretrained(tmp_path / "out").eval()
    assert back.config.attention_type == "original_full"
    with torch.no_grad():
        assert_parity(back(ids, attention_mask=mask).last_hidden_state, theirs.last_hidden_state, mask)


_GPT = {"vocab_size": 99, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "bos_token_id": 0,
        "eos_token_id": 0}
_LLAMA = {"vocab_size": 99, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64,
          "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 0}
_BLOOM = {"vocab_size": 99, "hidden_size": 32, "n_layer": 2, "n_head": 4, "bos_token_id": 0,
          "eos_token_id": 0}
_XLNET = {"vocab_size": 99, "d_model": 32, "n_layer": 2, "n_head": 4, "d_inner": 48, "bos_token_id": 0,
          "eos_token_id": 2}
# (architecture, its config class and sizes, the token table and the LM head inside the checkpoint)
_TIED_HEADS = [
    ("GPT2LMHeadModel", "GPT2Config", _GPT, "transformer.wte.weight", "lm_head.weight"),
    ("OpenAIGPTLMHeadModel", "OpenAIGPTConfig", _GPT, "transformer.tokens_embed.weight", "lm_head.weight"),
    ("LlamaForCausalLM", "LlamaConfig", _LLAMA, "model.embed_tokens.weight", "lm_head.weight"),
    ("MistralForCausalLM", "MistralConfig", _LLAMA, "model.embed_tokens.weight", "lm_head.weight"),
    ("BloomForCausalLM", "BloomConfig", _BLOOM, "transformer.word_embeddings.weight", "lm_head.weight"),
    ("XLNetLMHeadModel", "XLNetConfig", _XLNET, "transformer.word_embedding.weight", "lm_loss.weight"),
]


@pytest.mark.parametrize("architecture, config, sizes, table, head", _TIED_HEADS)
def test_a_stored_head_that_differs_from_the_tied_table_is_used_as_the_reference_uses_it(
        tmp_path, architecture, config, sizes, table, head):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    save_reference(getattr(transformers, architecture)(getattr(transformers, config)(**sizes)), tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))  # a config that says tied, a head that is not
    tensors[head] = torch.randn_like(tensors[table])
    save_file(tensors, str(tmp_path / "model.safetensors"), {"format": "pt"})
    reference = getattr(transformers, architecture).from_pretrained(tmp_path).eval()  # keeps both, untied
    model = lmforge.load(tmp_path)
    assert not model.config.tie_embeddings
    assert_forward_parity(model, reference, *padded_batch(99))


@pytest.mark.parametrize("architecture", ["LlamaModel", "LlamaForSequenceClassification"])
def test_a_config_that_says_untied_stays_untied_without_a_stored_head(tmp_path, architecture):
    torch.manual_seed(0)
    sizes = {**_LLAMA, "tie_word_embeddings": False, "pad_token_id": 0}
    save_reference(getattr(transformers, architecture)(transformers.LlamaConfig(**sizes)), tmp_path / "in")
    model = lmforge.load(tmp_path / "in")  # no LM head stored: the architecture stays the one trained
    assert not model.config.tie_embeddings
    model.save(tmp_path / "out", format="hf")
    assert transformers.AutoConfig.from_pretrained(tmp_path / "out").tie_word_embeddings is False


_ENCODER = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 48, "max_position_embeddings": 128, "pad_token_id": 1}
# (masked-LM architecture, its config and extra sizes, the head's bias and the decoder's stored copy of it)
_TIED_BIASES = [
    ("BertForMaskedLM", "BertConfig", {}, "cls.predictions.bias", "cls.predictions.decoder.bias"),
    ("RobertaForMaskedLM", "RobertaConfig", {}, "lm_head.bias", "lm_head.decoder.bias"),
    ("AlbertForMaskedLM", "AlbertConfig", {"embedding_size": 16}, "predictions.bias",
     "predictions.decoder.bias"),
    ("BigBirdForMaskedLM", "BigBirdConfig", {"block_size": 2, "num_random_blocks": 1}, "cls.predictions.bias",
     "cls.predictions.decoder.bias"),
]


@pytest.mark.parametrize("architecture, config, sizes, bias, copy", _TIED_BIASES)
def test_a_stored_decoder_bias_that_differs_from_the_tied_one_is_refused(
        tmp_path, architecture, config, sizes, bias, copy):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    save_reference(getattr(transformers, architecture)(getattr(transformers, config)(**_ENCODER, **sizes)),
                   tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))  # the reference would apply the copy
    tensors[copy] = torch.randn_like(tensors[bias])
    save_file(tensors, str(tmp_path / "model.safetensors"), {"format": "pt"})
    with pytest.raises(CheckpointError, match=f"{copy} differs from {bias}"):
        lmforge.load(tmp_path)
