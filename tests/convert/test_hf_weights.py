"""Reading a reference folder's weight files: shards checked against their index, a non-state-dict refused."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import lmforge
from lmforge.io import CheckpointError

transformers = pytest.importorskip("transformers")


def _sharded(path):
    """A tiny BERT saved in several shards; (its index's weight map, the shard names in order)."""
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64)).save_pretrained(path, max_shard_size="20KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    return index, sorted(set(index.values()))


def test_sharded_weights_load_as_the_single_file(tmp_path):
    _sharded(tmp_path / "a")
    whole = lmforge.load(tmp_path / "a").state_dict()
    reference = transformers.BertModel.from_pretrained(tmp_path / "a")
    reference.save_pretrained(tmp_path / "b")
    assert all(torch.equal(whole[k], v) for k, v in lmforge.load(tmp_path / "b").state_dict().items())


def test_a_tensor_in_two_shards_is_refused_naming_the_shard(tmp_path):
    """The later shard's copy (zeros here) silently won over the one the index names."""
    index, shards = _sharded(tmp_path)
    name = next(k for k, v in index.items() if v == shards[0])
    other = load_file(tmp_path / shards[1])
    save_file({**other, name: torch.zeros_like(load_file(tmp_path / shards[0])[name])}, tmp_path / shards[1])
    with pytest.raises(CheckpointError, match=f"{shards[1]} holds '{name}'") as refused:
        lmforge.load(tmp_path)
    assert "\n" not in str(refused.value)


def test_a_shard_lacking_what_its_index_places_there_is_refused_naming_both(tmp_path):
    index, shards = _sharded(tmp_path)
    name = next(k for k, v in index.items() if v == shards[0])
    save_file({k: v for k, v in load_file(tmp_path / shards[0]).items() if k != name}, tmp_path / shards[0])
    with pytest.raises(CheckpointError, match=f"{shards[0]} lacks '{name}', against its index"):
        lmforge.load(tmp_path)


def test_pytorch_model_bin_shards_load_as_the_reference_loads_them(tmp_path):
    """Older large checkpoints: pytorch_model-0000i-of-0000n.bin with pytorch_model.bin.index.json were
    refused as having no weights."""
    index, shards = _sharded(tmp_path / "ref")
    whole = lmforge.load(tmp_path / "ref").state_dict()
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "config.json").write_bytes((tmp_path / "ref" / "config.json").read_bytes())
    names = {shard: shard.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
             for shard in shards}
    for shard, name in names.items():
        torch.save(load_file(tmp_path / "ref" / shard), folder / name)
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: names[v] for k, v in index.items()}}))
    loaded = lmforge.load(folder).state_dict()
    assert sorted(loaded) == sorted(whole) and all(torch.equal(whole[k], loaded[k]) for k in whole)
    assert transformers.BertModel.from_pretrained(folder) is not None  # the reference reads the folder too


@pytest.mark.parametrize("content", [[torch.zeros(2)], {"embeddings.word_embeddings.weight": 3}])
def test_a_pytorch_model_bin_holding_no_state_dict_is_refused_naming_it(tmp_path, content):
    """A list of tensors failed with a bare TypeError traceback."""
    _sharded(tmp_path)
    for file in tmp_path.glob("model*.safetensors*"):
        file.unlink()
    torch.save(content, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin holds no state dict"):
        lmforge.load(tmp_path)


def _altered(path, reference, name, tensor):
    """`reference` saved with its tensor `name` replaced by `tensor`."""
    reference.save_pretrained(path)
    save_file({**load_file(path / "model.safetensors"), name: tensor}, path / "model.safetensors")


@pytest.mark.parametrize("name, tensor", [
    ("encoder.layer.0.attention.self.key.weight", torch.zeros(32, 31)),  # fused into qkv: a RuntimeError
    ("encoder.layer.0.output.dense.bias", torch.zeros(1, 32)),
    ("encoder.layer.0.output.dense.bias", torch.zeros(32, dtype=torch.int64)),  # was cast to floats
])
def test_a_tensor_of_the_wrong_shape_or_kind_is_refused_naming_it(tmp_path, name, tensor):
    torch.manual_seed(0)
    _altered(tmp_path, transformers.BertModel(transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64)), name, tensor)
    with pytest.raises(CheckpointError,
                       match=f"the checkpoint's {name} (has shape|holds torch.int64)") as refused:
        lmforge.load(tmp_path)
    assert "\n" not in str(refused.value)


def test_xlnet_operands_of_other_heads_are_refused_not_reshaped(tmp_path):
    """(d_model, 2, 16) where the config gives 4 heads of 8 loaded silently, its columns dealt to
    other heads."""
    torch.manual_seed(0)
    _altered(tmp_path, transformers.XLNetModel(transformers.XLNetConfig(
        vocab_size=99, d_model=32, n_layer=1, n_head=4, d_inner=64)), "layer.0.rel_attn.o",
             torch.zeros(32, 2, 16))
    with pytest.raises(CheckpointError, match=r"layer.0.rel_attn.o has shape \(32, 2, 16\), where its "
                                              r"config.json gives \(32, 4, 8\)"):
        lmforge.load(tmp_path)
