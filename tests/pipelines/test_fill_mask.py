"""lmforge.pipelines.fill_mask and the `lmforge fill-mask` / `lmforge generate` commands on tiny random
models saved with tokenizers trained here (BERT: WordPiece, BART: byte-level BPE, T5: unigram)."""
import json

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.data import corpus_text
from lmforge.heads import attach
from lmforge.pipelines.fill_mask import fill_mask
from lmforge.tokenizer import train_tokenizer

CORPUS = [line for line in corpus_text(60, seed=0).splitlines() if line.strip()]
TEXT = "The river runs to the [MASK] of the valley."
# preset, tokenizer kind, vocabulary size, special ids of the config as tokenizer roles
FAMILIES = {"bert": ("bert-tiny", "wordpiece", 200, {}),
            "bart": ("bart-base", "bytelevel-bpe", 300,
                     {"pad_token_id": "pad", "bos_token_id": "bos", "eos_token_id": "eos",
                      "decoder_start_token_id": "eos"}),
            "t5": ("t5-small", "unigram", 200,
                   {"pad_token_id": "pad", "eos_token_id": "eos", "decoder_start_token_id": "pad"}),
            "gpt2": ("gpt2", "bytelevel-bpe", 300, {"eos_token_id": "eos"})}


def _saved(root, family: str):
    """A directory holding a tiny random model of `family` with an LM head and its tokenizer."""
    preset, kind, size, roles = FAMILIES[family]
    tokenizer = train_tokenizer(CORPUS, kind, size, family="gpt2" if family == "gpt2" else None)
    ids = {field: tokenizer.special_id(role) for field, role in roles.items()}
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(preset, vocab_size=len(tokenizer), **ids)).eval()
    if model.config.tied_logit_scale:  # T5's N(0, 1) table makes a random model's beams all end at once
        torch.nn.init.normal_(model.tokens.weight, std=0.02)
    attach(model, "lm")
    model.save(root / family)
    tokenizer.save(root / family)
    return root / family, model, tokenizer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("fill")
    return {family: _saved(root, family) for family in FAMILIES}


def _well_formed(candidates, top_k):
    scores = [c.score for c in candidates]
    assert len(candidates) == top_k and all(0 < s <= 1 for s in scores)
    assert scores == sorted(scores, reverse=True) and sum(scores) <= 1 + 1e-6


@pytest.mark.parametrize("mask", ["[MASK]", "<mask>"])
def test_encoder_candidates_are_its_distribution_at_the_mask(saved, mask):
    _, model, tokenizer = saved["bert"]
    out = fill_mask(model, tokenizer, TEXT.replace("[MASK]", mask), top_k=5)
    _well_formed(out, 5)
    enc = tokenizer.encode(TEXT)
    at = enc.ids.index(tokenizer.mask_id)
    with torch.no_grad():
        probs = model(torch.tensor([enc.ids])).logits[0, at].softmax(-1)
    assert [c.token_id for c in out] == probs.topk(5).indices.tolist()
    torch.testing.assert_close(torch.tensor([c.score for c in out]), probs.topk(5).values)
    assert out[0].sequence == tokenizer.decode(enc.ids[:at] + [out[0].token_id] + enc.ids[at + 1:])


def test_encoder_scores_match_the_reference_pipeline(saved, tmp_path):
    transformers = pytest.importorskip("transformers")
    _, model, tokenizer = saved["bert"]
    model.save(tmp_path, format="hf")
    tokenizer.save(tmp_path)
    theirs = transformers.pipeline("fill-mask", model=str(tmp_path), tokenizer=str(tmp_path), top_k=5)(TEXT)
    ours = fill_mask(model, tokenizer, TEXT, top_k=5)
    assert [c.token_id for c in ours] == [t["token"] for t in theirs]
    torch.testing.assert_close(torch.tensor([c.score for c in ours]),
                               torch.tensor([t["score"] for t in theirs]), atol=1e-5, rtol=1e-4)


def test_a_byte_level_candidate_is_its_text_as_the_reference_pipeline_writes_it(tmp_path):
    """A RoBERTa-style vocabulary's candidates read as their entries ("Ġriver", "Ć" for a byte) where the
    reference's token_str is the text they put in the gap (" river", "\\x06")."""
    transformers = pytest.importorskip("transformers")
    tokenizer = train_tokenizer(CORPUS, "bytelevel-bpe", 300, family="roberta")
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("roberta-base", vocab_size=len(tokenizer),
                                       pad_token_id=tokenizer.special_id("pad"))).eval()
    attach(model, "lm")
    model.save(tmp_path, format="hf")
    tokenizer.save(tmp_path)
    text = "The river runs to the <mask> of the valley."
    theirs = transformers.pipeline("fill-mask", model=str(tmp_path), tokenizer=str(tmp_path), top_k=8)(text)
    ours = fill_mask(model, tokenizer, text, top_k=8)
    assert [c.token_id for c in ours] == [t["token"] for t in theirs]
    assert [c.token for c in ours] == [t["token_str"] for t in theirs]
    assert [c.sequence for c in ours] == [t["sequence"] for t in theirs]


def test_t5_generates_the_span_of_its_first_sentinel(saved):
    _, model, tokenizer = saved["t5"]
    out = fill_mask(model, tokenizer, TEXT, top_k=4, max_span=4)
    _well_formed(out, 4)
    assert len({c.token for c in out}) > 1
    for c in out:
        assert c.sequence == TEXT.replace("[MASK]", c.token) and "<extra_id" not in c.token


def test_t5_s_refusal_of_a_text_without_a_mask_names_its_sentinel_among_the_spellings(saved):
    _, model, tokenizer = saved["t5"]
    with pytest.raises(lmforge.OptionsError, match=r"\(\[MASK\] or <mask> or <extra_id_0>\), found 0"):
        fill_mask(model, tokenizer, "No mask here.")


def test_bart_rewrites_the_sentence(saved):
    _, model, tokenizer = saved["bart"]
    out = fill_mask(model, tokenizer, TEXT, top_k=3, max_span=3)
    _well_formed(out, 3)
    assert all("<mask>" not in c.sequence for c in out)


@pytest.mark.parametrize("text, match", [("No mask here.", "exactly one mask"),
                                         ("[MASK] and <mask>.", "exactly one mask")])
def test_bad_texts_are_refused(saved, text, match):
    _, model, tokenizer = saved["bert"]
    with pytest.raises(ValueError, match=match):
        fill_mask(model, tokenizer, text)


def test_an_encoder_without_its_masked_lm_head_is_refused_in_its_own_words(saved):
    _, model, tokenizer = saved["bert"]
    bare = lmforge.build(model.config)
    for name in list(bare.heads):
        del bare.heads[name]
    with pytest.raises(ValueError, match=r"^fill-mask needs the model's masked-LM head \('lm'\)"):
        fill_mask(bare, tokenizer, TEXT)


def test_a_decoder_cannot_fill_a_mask(saved):
    _, model, tokenizer = saved["gpt2"]
    with pytest.raises(ValueError, match="decoder"):
        fill_mask(model, tokenizer, TEXT)


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_the_largest_span_allowed_writes_what_the_context_holds(saved, family):
    from lmforge.pipelines.fill_mask import MAX_SPAN

    _, model, tokenizer = saved[family]  # max_seq_len 64: far below MAX_SPAN
    candidates = fill_mask(model, tokenizer, TEXT, top_k=2, max_span=MAX_SPAN)  # was max_new_tokens' refusal
    assert len(candidates) == 2 and all(0 < c.score <= 1 for c in candidates)


def test_costs_are_bounded_both_ways_naming_the_field(saved, capsys):
    _, model, tokenizer = saved["bert"]
    for kwargs, match in (({"top_k": 0}, "top_k must be"), ({"top_k": 10 ** 12}, "<= 100000"),
                          ({"top_k": True}, "top_k must be"), ({"max_span": 0}, "max_span must be"),
                          ({"max_span": 10 ** 12}, "<= 4094")):
        with pytest.raises(ValueError, match=match):
            fill_mask(model, tokenizer, TEXT, **kwargs)
    _, t5, t5_tokenizer = saved["t5"]
    with pytest.raises(ValueError, match="top_k=65: an encoder-decoder's fillings are beams, at most 64"):
        fill_mask(t5, t5_tokenizer, TEXT, top_k=65)
    for flag, value in (("--top-k", "1000000000000"), ("--max-span", "0")):  # before any model loads
        assert main(["fill-mask", "--model", "no-such-model", TEXT, flag, value]) == 2
        err = capsys.readouterr().err
        assert f"{flag} {value}: " in err and err.count("\n") == 1, err


def test_fill_mask_command(saved, capsys):
    assert main(["fill-mask", "--model", str(saved["bert"][0]), TEXT, "--top-k", "3", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 3 and rows[0]["score"] >= rows[1]["score"] >= rows[2]["score"]
    assert main(["fill-mask", "--model", str(saved["t5"][0]), TEXT, "--top-k", "2", "--max-span", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["fill-mask", "--model", str(saved["bert"][0]), "no mask"]) == 2
    assert "exactly one mask" in capsys.readouterr().err


def test_generate_command_with_beams_and_processors(saved, capsys):
    path = str(saved["gpt2"][0])
    common = ["generate", "--model", path, "The river", "--max-new-tokens", "6"]
    assert main([*common, "--num-beams", "3", "--length-penalty", "0.5", "--no-repeat-ngram", "2",
                 "--min-new-tokens", "2"]) == 0
    assert capsys.readouterr().out.startswith("The river")
    assert main(common) == 0
    plain = capsys.readouterr().out
    assert main([*common, "--stream"]) == 0
    assert capsys.readouterr().out == plain  # the stream prints the same text
    assert main([*common, "--stream", "--num-beams", "2"]) == 2
    assert "--stream" in capsys.readouterr().err
    assert main(["generate", "--model", str(saved["t5"][0]), "The river", "--max-new-tokens", "4",
                 "--num-beams", "2"]) == 0


def test_generate_command_takes_the_checkpoints_recommended_settings(saved, capsys, tmp_path):
    import shutil

    from lmforge.convert.hf import generation_defaults

    path = tmp_path / "recommends"
    shutil.copytree(saved["gpt2"][0], path)
    (path / "generation_config.json").write_text(json.dumps(
        {"num_beams": 3, "no_repeat_ngram_size": 2, "max_length": 9, "pad_token_id": 0}))
    assert generation_defaults(path) == {"num_beams": 3, "no_repeat_ngram_size": 2, "max_length": 9}
    assert main(["generate", "--model", str(path), "The river"]) == 0
    out = capsys.readouterr()
    assert "num_beams=3" in out.err and "no_repeat_ngram_size=2" in out.err
    model, tokenizer = saved["gpt2"][1], saved["gpt2"][2]
    ids = torch.tensor([tokenizer.encode("The river", add_special_tokens=False).ids])
    expected = lmforge.generate(model, ids, max_new_tokens=9 - ids.shape[1], num_beams=3,
                                no_repeat_ngram_size=2, eos_token_id=tokenizer.eos_id)
    assert out.out.rstrip("\n") == "The river" + tokenizer.decode(expected[0, ids.shape[1]:].tolist())
    # a flag given wins over the checkpoint, and then nothing is reported as taken from it
    assert main(["generate", "--model", str(path), "The river", "--num-beams", "1", "--no-repeat-ngram", "0",
                 "--max-new-tokens", "3"]) == 0
    assert "settings from the checkpoint" not in capsys.readouterr().err
    assert generation_defaults(tmp_path / "missing") == {}


def test_model_names_resolve_as_in_every_command(saved, capsys, tmp_path, monkeypatch):
    """--model takes an installed model's name (as embed and finetune do); a preset is refused."""
    import shutil

    from lmforge.io import resolve

    package = tmp_path / "site" / "lmforge_test_models"
    for family in ("bert", "gpt2"):
        shutil.copytree(saved[family][0], package / family)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(resolve.MODEL_PACKAGES, "test-bert", ("lmforge_test_models", "bert"))
    monkeypatch.setitem(resolve.MODEL_PACKAGES, "test-gpt2", ("lmforge_test_models", "gpt2"))
    assert main(["fill-mask", "--model", "Test-BERT", TEXT, "--top-k", "2", "--json"]) == 0
    by_name = capsys.readouterr().out
    assert main(["fill-mask", "--model", str(saved["bert"][0]), TEXT, "--top-k", "2", "--json"]) == 0
    assert capsys.readouterr().out == by_name and len(by_name.splitlines()) == 2
    assert main(["generate", "--model", "test-gpt2", "The river", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith("The river")
    for command, text in (("fill-mask", TEXT), ("generate", "The river")):
        assert main([command, "--model", "bert-tiny", text]) == 2
        assert "is a preset" in capsys.readouterr().err
        assert main([command, "--model", str(tmp_path / "nothing"), text]) == 2
        assert "neither a model directory nor" in capsys.readouterr().err
    assert main(["generate", "--model", "test-bert", "The river"]) == 2
    out = capsys.readouterr()
    assert "is an encoder" in out.err and out.out == ""  # refused before the prompt is echoed


def test_a_model_directory_fills_with_its_own_tokenizer_as_embed_and_rerank_read_one(saved):
    path, model, tokenizer = saved["bert"]
    by_objects = fill_mask(model, tokenizer, TEXT, top_k=3)
    assert lmforge.fill_mask(str(path), None, TEXT, top_k=3) == by_objects
    assert lmforge.fill_mask(path, tokenizer, TEXT, top_k=3) == by_objects
    with pytest.raises(lmforge.OptionsError, match=r"needs its tokenizer") as caught:  # was an AttributeError
        fill_mask(model, None, TEXT)
    assert caught.value.field == "tokenizer"
    # was a TypeError, which no caller of a request's refusals (OptionsError) catches
    with pytest.raises(lmforge.OptionsError,
                       match="takes a Transformer, a model directory or an installed model") as caught:
        fill_mask(5, tokenizer, TEXT)
    assert caught.value.field == "model"


def test_numpy_numbers_read_as_python_s_as_an_options_field_reads_them(saved):
    """top_k=np.int64(3) and max_span=np.int32(4) were refused as not integers
    (an options field took them)."""
    import numpy as np

    for family in ("bert", "t5"):
        _, model, tokenizer = saved[family]
        want = fill_mask(model, tokenizer, TEXT, top_k=2, max_span=4)
        got = fill_mask(model, tokenizer, TEXT, top_k=np.int64(2), max_span=np.int32(4))
        assert [(c.token, c.score) for c in got] == [(c.token, c.score) for c in want]
    with pytest.raises(ValueError, match="top_k must be an integer >= 1"):
        fill_mask(model, tokenizer, TEXT, top_k=np.int64(0))


@pytest.mark.parametrize("field, value, accepted", [
    ("top_k", 3.0, True), ("max_span", 3.0, True), ("top_k", 3.5, False), ("max_span", 0.0, False),
    ("top_k", 0, False), ("max_span", 4095, False)])
def test_fill_mask_s_three_faces_read_a_count_alike(saved, capsys, field, value, accepted):
    # one FillOptions: `--top-k 3.0` was argparse's "must be an integer" where Python and the server took 3
    from fastapi.testclient import TestClient

    from lmforge.serve import create_app, load_served

    path = saved["bert"][0]
    try:
        python = len(fill_mask(str(path), None, TEXT, **{field: value})) > 0
    except lmforge.OptionsError as err:
        python = err.field
    status = main(["fill-mask", "--model", str(path), TEXT, f"--{field.replace('_', '-')}", str(value)])
    cli = status == 0 or capsys.readouterr().err
    with TestClient(create_app({"bert": load_served("bert", path)}, threads=1)) as client:
        answer = client.post("/fill_mask", json={"model": "bert", "text": TEXT, field: value})
    server = answer.status_code == 200 or answer.json()["error"]["param"]
    if accepted:
        assert python is True and cli is True and server is True, (python, cli, server)
    else:
        assert python == field and server == field and status == 2, (python, server, cli)
        assert f"--{field.replace('_', '-')} {value}: " in cli and cli.count("\n") == 1, cli


def test_a_directory_fills_with_text_as_a_keyword_and_a_text_in_the_tokenizers_place_is_named(saved):
    """fill_mask(DIR, text=...) was a TypeError (tokenizer was required) and fill_mask(DIR, "a [MASK]") read
    the text as a tokenizer's name; fill_mask(DIR, None, text) reads as before."""
    path, model, tokenizer = saved["bert"]
    want = fill_mask(model, tokenizer, TEXT, top_k=2)
    assert lmforge.fill_mask(str(path), text=TEXT, top_k=2) == want
    assert lmforge.fill_mask(str(path), None, TEXT, top_k=2) == want
    assert lmforge.fill_mask(str(path), str(path), TEXT, top_k=2) == want  # a folder named: its tokenizer
    for text in (TEXT, "a <mask> b", "a <extra_id_0> b"):
        with pytest.raises(lmforge.OptionsError, match=r"holds a mask, so it reads as the text: pass it as "
                                                       r"text=") as caught:
            lmforge.fill_mask(str(path), text)
        assert caught.value.field == "tokenizer"
    with pytest.raises(lmforge.OptionsError, match=r"^fill_mask needs the text holding the mask") as caught:
        lmforge.fill_mask(str(path))
    assert caught.value.field == "text"


def test_fill_mask_refusals_are_typed_naming_the_argument(saved):
    """A name of no model is lmforge.load's CheckpointError; a bad text, a decoder or a headless encoder an
    OptionsError naming the argument (all were plain ValueErrors)."""
    from lmforge.io import CheckpointError

    with pytest.raises(CheckpointError, match=r"^nope is neither a model directory nor a known model"):
        lmforge.fill_mask("nope", None, "a [MASK]")
    _, model, tokenizer = saved["bert"]
    with pytest.raises(lmforge.OptionsError, match="exactly one mask") as caught:
        fill_mask(model, tokenizer, "No mask here.")
    assert caught.value.field == "text"
    _, decoder, decoder_tokenizer = saved["gpt2"]
    with pytest.raises(lmforge.OptionsError, match="a decoder only continues text") as caught:
        fill_mask(decoder, decoder_tokenizer, TEXT)
    assert caught.value.field == "model"


@pytest.mark.parametrize("text, said", [(5, "text must be a text or UTF-8 bytes, got int"),
                                        (["a [MASK]"], "got list"),
                                        ("a [MASK] \ud800", "text is not valid Unicode: surrogates not"),
                                        (b"a [MASK] \xff", "text is not valid Unicode: byte 0xff is not")])
def test_a_text_that_is_no_text_is_an_options_error_naming_text(saved, text, said):
    """text=5 was the tokenizer's TypeError, a lone surrogate its ValueError: neither an OptionsError (the one
    lmforge.OptionsError catches, as the command line's exit 2 and the server's 422 are) nor naming text."""
    _, model, tokenizer = saved["bert"]
    with pytest.raises(lmforge.OptionsError, match=said) as caught:
        fill_mask(model, tokenizer, text)
    assert caught.value.field == "text"


@pytest.mark.parametrize("bad", [5, "a [MASK] \ud800"])
def test_fill_mask_words_a_bad_text_as_embed_and_the_tokenizer_do(saved, tmp_path, bad):
    """One rule (utils.errors.checked_text) and one wording: fill-mask said "text is not valid UTF-8" and
    "must be str or UTF-8 bytes" where embed said "texts[0] is not valid Unicode" and "must be text"."""
    _, model, tokenizer = saved["bert"]
    said = []
    for refuse in (lambda: fill_mask(model, tokenizer, bad), lambda: tokenizer.encode(bad),
                   lambda: lmforge.embed([bad], model=tmp_path / "missing")):
        with pytest.raises(lmforge.OptionsError) as refused:
            refuse()
        said.append((str(refused.value), refused.value.field))
    assert said[0] == said[1] and said[0][1] == "text" and said[2][1] == "texts"
    verb = " is not valid Unicode: " if isinstance(bad, str) else " must be "
    mine, embeds = said[0][0].split(verb), said[2][0].split(verb)  # [who, what follows]
    assert (mine[0], embeds[0]) == ("text", "texts[0]")
    assert mine[1].split(", got ")[-1] == embeds[1].split(", got ")[-1]  # the same reason, or the same type
