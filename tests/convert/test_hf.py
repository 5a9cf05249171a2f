"""Reading a Hugging Face directory's side files: a damaged one is named, never read as absent."""
import pytest

from lmforge.convert.hf import forced_tokens
from lmforge.convert.keymap import ConversionError


@pytest.mark.parametrize("text", ['{"forced_eos_token_id": 2, "forc', "[2]", b"\xff{}"])
def test_a_damaged_generation_config_json_is_refused_naming_it(tmp_path, text):
    """A cut file was read as no file, so a BART's forced end token was dropped unsaid (helper's probe)."""
    assert forced_tokens(tmp_path) == {}  # none: nothing forced
    (tmp_path / "generation_config.json").write_text('{"forced_eos_token_id": 2}')
    assert forced_tokens(tmp_path) == {"forced_bos_token_id": None, "forced_eos_token_id": 2}
    file = tmp_path / "generation_config.json"
    file.write_bytes(text) if isinstance(text, bytes) else file.write_text(text)
    with pytest.raises(ConversionError, match=f"^{file}: not") as refused:
        forced_tokens(tmp_path)
    assert "\n" not in str(refused.value)


def test_an_unexpressible_config_names_the_closest_families_fields(tmp_path):
    """A RoBERTa whose positions ignore the padding (saved before position_from_padding) is one field off
    the reference's RoBERTa: the refusal says which, so the user can choose."""
    import lmforge

    model = lmforge.build(lmforge.tiny("roberta-base", position_from_padding=False))
    with pytest.raises(ConversionError, match=r"roberta \(position_from_padding\)") as refused:
        model.save(tmp_path, format="hf")
    assert "\n" not in str(refused.value)


def test_a_roberta_saved_before_position_from_padding_still_exports(tmp_path):
    """Its config.json has no such field: it is read as the RoBERTa it was built as, and exports."""
    import json

    import lmforge

    model = lmforge.build(lmforge.tiny("roberta-base"))
    model.save(tmp_path / "old")
    meta = json.loads((tmp_path / "old" / "config.json").read_text())
    del meta["config"]["position_from_padding"]
    del meta["config_sha256"]  # nor its checksum, which came later still
    (tmp_path / "old" / "config.json").write_text(json.dumps(meta))
    old = lmforge.load(tmp_path / "old")
    assert old.config.position_from_padding
    old.save(tmp_path / "hf", format="hf")
    assert lmforge.load(tmp_path / "hf").config.canonical() == old.config.canonical()


@pytest.mark.parametrize("shard", ["../other/model.safetensors", "/etc/passwd", "sub/model.safetensors",
                                   ".."])
def test_a_sharded_index_naming_a_file_outside_its_folder_is_refused(tmp_path, shard):
    """Its shards were read wherever they lay: a folder of a config and an index imported another
    folder's weights as its own."""
    import json

    import lmforge
    from lmforge.io import CheckpointError

    model = lmforge.build(lmforge.tiny("bert-base"))
    model.save(tmp_path / "other", format="hf")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_bytes((tmp_path / "other" / "config.json").read_bytes())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(CheckpointError, match="names a shard .* that is not a file of the folder"):
        lmforge.load(folder)


def test_an_architecture_whose_heads_fit_but_that_loads_another_model_is_named_with_the_field(tmp_path):
    """A bare Longformer with the classifier's global <s> was refused as
    'no architecture has the heads []'."""
    import lmforge

    model = lmforge.build(lmforge.tiny("longformer-base", n_global_tokens=1))
    with pytest.raises(ConversionError,
                       match=r"LongformerModel would load n_global_tokens=0 \(this model: 1\)"):
        model.save(tmp_path, format="hf")
    lmforge.build(lmforge.tiny("longformer-base", n_global_tokens=0)).save(tmp_path, format="hf")
    assert lmforge.load(tmp_path).config.n_global_tokens == 0


def test_an_export_over_another_models_folder_takes_none_of_its_generation_tokens(tmp_path):
    """A generation_config.json left there is where the reference (and load) read the forced and special
    tokens from: a BART exported over another model's folder reloaded with its forced_bos_token_id."""
    import json

    import lmforge

    (tmp_path / "generation_config.json").write_text(json.dumps({"forced_bos_token_id": 5, "num_beams": 4}))
    model = lmforge.build(lmforge.tiny("bart-base", forced_eos_token_id=2))
    model.save(tmp_path, format="hf")
    written = json.loads((tmp_path / "generation_config.json").read_text())
    from lmforge.config import SPECIAL_TOKENS

    assert written == {k: getattr(model.config, k) for k in SPECIAL_TOKENS
                       if getattr(model.config, k) is not None}
    assert written["forced_eos_token_id"] == 2 and "num_beams" not in written
    assert lmforge.load(tmp_path).config.canonical() == model.config.canonical()


@pytest.mark.parametrize("preset, changed", [
    ("gpt2", r"bias=False \(this model's head: True\), pooler=False \(this model's head: True\), "
             r"pooling='last' \(this model's head: 'first'\)"),
    ("xlnet-base", r"pooling='last' \(this model's head: 'first'\)")])
def test_a_classifier_the_reference_computes_otherwise_is_refused_naming_its_fields(tmp_path, preset,
                                                                                    changed):
    """A GPT-2 classifier pooling the first token through a pooler was written as
    GPT2ForSequenceClassification (the last real token's score, no pooler, no bias): the pooler and bias
    were dropped, its logits off by 0.2."""
    import lmforge
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny(preset, pad_token_id=0))
    attach(model, "classification", n_labels=3)
    computes = f"ForSequenceClassification computes its classification head with {changed}$"
    with pytest.raises(ConversionError, match=computes) as refused:
        model.save(tmp_path / "first", format="hf")
    assert "\n" not in str(refused.value) and not (tmp_path / "first").exists()
    model.heads.pop("classification")
    attach(model, "classification", n_labels=3, pooling="last",
           **({"pooler": False, "bias": False} if preset == "gpt2" else {}))
    model.save(tmp_path / "last", format="hf")
    loaded = lmforge.load(tmp_path / "last")
    assert loaded.heads["classification"].spec == model.heads["classification"].spec


@pytest.mark.parametrize("preset", ["llama-3.2-1b", "gpt2", "bart-base", "t5-small", "albert-base"])
def test_unset_special_tokens_stay_unset_in_the_reference(tmp_path, preset):
    """Left out of config.json, the reference class's defaults stood in: a Llama's eos 2, GPT-2's bos/eos
    50256 (out of a small vocabulary), BART's decoder start 2; the reference's own save wrote them back."""
    transformers = pytest.importorskip("transformers")
    import lmforge
    from lmforge.config import SPECIAL_TOKENS

    start = {"decoder_start_token_id": 0} if preset == "t5-small" else {}  # T5 has no default start
    model = lmforge.build(lmforge.tiny(preset, **start))
    model.save(tmp_path / "hf", format="hf")
    reference = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        assert getattr(reference, name, None) == getattr(model.config, name), name
    reference.save_pretrained(tmp_path / "resaved")
    weights = (tmp_path / "hf" / "model.safetensors").read_bytes()
    (tmp_path / "resaved" / "model.safetensors").write_bytes(weights)
    resaved = lmforge.load(tmp_path / "resaved").config
    assert {k: getattr(resaved, k) for k in SPECIAL_TOKENS} == {k: getattr(model.config, k)
                                                                 for k in SPECIAL_TOKENS}


IDENTITY = "torch.nn.modules.linear.Identity"


@pytest.mark.parametrize("activation", [IDENTITY, None])
def test_a_cross_encoder_exported_as_hugging_face_keeps_its_activation(tmp_path, activation):
    """save_hf wrote id2label and problem_type alone: an Identity CrossEncoder came back as one that
    sentence-transformers scores by sigmoid and lmforge reads as no CrossEncoder. Its activation_fn is
    written back, from its config.json or from a converted folder's task.json."""
    import json

    import lmforge
    from lmforge.tasks.finetune import task_info
    from lmforge.tasks.reference import task_file
    from tests.tasks.hf_reference import reference_dir

    _, path = reference_dir(tmp_path / "ce", num_labels=1,
                            sentence_transformers={"activation_fn": activation})
    lmforge.save(lmforge.load(path), tmp_path / "hf", format="hf")
    native = tmp_path / "native"  # as `lmforge convert` brings it into lmforge's format, and back
    lmforge.save(lmforge.load(path), native)
    info = task_file(path / "config.json", json.loads((path / "config.json").read_text()), 128)
    (native / "task.json").write_text(json.dumps(info))
    lmforge.save(lmforge.load(native), tmp_path / "back", format="hf")
    want = "identity" if activation else "sigmoid"
    for out in ("hf", "back"):
        config = json.loads((tmp_path / out / "config.json").read_text())
        assert config["sentence_transformers"]["activation_fn"].rsplit(".", 1)[-1].lower() == want
        assert task_info(tmp_path / out)["activation"] == want
    st = pytest.importorskip("sentence_transformers")
    assert type(st.CrossEncoder(str(tmp_path / "hf"), device="cpu").activation_fn).__name__.lower() == want


def test_a_plain_regressor_exported_stays_no_cross_encoder_and_a_reranker_says_its_sigmoid(tmp_path):
    import json

    from lmforge.tasks.finetune import TaskConfig, make_task
    from tests.tasks.core import tiny, tokenizer

    for kind, want in (("regression", None), ("rerank", "torch.nn.modules.activation.Sigmoid")):
        task = make_task(kind, tiny(), tokenizer(), [], TaskConfig())
        task.model.save(tmp_path / kind, format="hf")
        block = json.loads((tmp_path / kind / "config.json").read_text()).get("sentence_transformers")
        assert (block or {}).get("activation_fn") == want
