"""A tokenizer that can emit ids the model has no embedding for is refused, in one line naming both
sizes, wherever a model and a tokenizer meet; a tokenizer smaller than the model (a padded
vocabulary) is fine."""
import pytest
from tokenizers import Tokenizer as Backend
from tokenizers.models import WordLevel

import lmforge
from lmforge.cli import main
from lmforge.config.options import OptionsError
from lmforge.data import corpus_text
from lmforge.heads import attach
from lmforge.pipelines.embed import embed
from lmforge.pipelines.fill_mask import fill_mask
from lmforge.tokenizer import Tokenizer, check_fits, id_count, train_tokenizer


@pytest.fixture(scope="module")
def big_tokenizer():
    """A WordPiece tokenizer of 1000 ids."""
    tokenizer = train_tokenizer(corpus_text(300, seed=0).splitlines(), "wordpiece", 1000)
    assert id_count(tokenizer) == 1000
    return tokenizer


def _model_dir(path, preset, vocab_size, tokenizer, head="lm", **args):
    model = lmforge.build(lmforge.tiny(preset), vocab_size=vocab_size).eval()
    attach(model, head, **args)
    model.save(path)
    tokenizer.save(path)
    return path


def assert_refused(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "1000 ids" in err and "vocab_size=400" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_ids_past_the_model_are_refused_with_both_sizes(big_tokenizer):
    model = lmforge.build(lmforge.tiny("bert-base"), vocab_size=400)
    with pytest.raises(ValueError, match=r"it has 1000 ids .* only 400 \(vocab_size=400\)"):
        check_fits(big_tokenizer, model)
    check_fits(big_tokenizer, model.config.replace(vocab_size=1024))  # padded past the tokenizer: fine
    check_fits(big_tokenizer, model.config.replace(vocab_size=1000))


def test_the_highest_id_counts_not_the_number_of_ids():
    backend = Backend(WordLevel({"[UNK]": 0, "a": 1, "b": 7}, unk_token="[UNK]"))
    tokenizer = Tokenizer(backend, {"unk": "[UNK]"})
    assert tokenizer.vocab_size == 3 and id_count(tokenizer) == 8
    with pytest.raises(OptionsError, match="8 ids") as err:
        check_fits(tokenizer, lmforge.get_config("bert-tiny", vocab_size=5))
    assert err.value.field == "tokenizer"


def test_fill_mask_refuses_a_tokenizer_too_big_for_the_model(tmp_path, big_tokenizer, capsys):
    path = _model_dir(tmp_path / "m", "bert-base", 400, big_tokenizer)
    assert_refused(capsys, ["fill-mask", "Paris is the [MASK] of France.", "--model", str(path)])
    with pytest.raises(OptionsError, match="does not fit"):
        fill_mask(lmforge.load(path), big_tokenizer, "a [MASK] b")


def test_fill_mask_takes_a_tokenizer_smaller_than_the_model(tmp_path, big_tokenizer, capsys):
    path = _model_dir(tmp_path / "m", "bert-base", 1024, big_tokenizer)  # a padded vocabulary
    assert main(["fill-mask", "Paris is the [MASK] of France.", "--model", str(path), "--top-k", "2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2


def test_embed_refuses_a_tokenizer_too_big_for_the_model(tmp_path, big_tokenizer, capsys):
    path = _model_dir(tmp_path / "m", "bert-base", 400, big_tokenizer)
    assert_refused(capsys, ["embed", "a sentence", "--model", str(path)])
    with pytest.raises(OptionsError, match="does not fit"):
        embed(["a sentence"], lmforge.load(path), tokenizer=big_tokenizer)


def test_evaluate_refuses_a_tokenizer_too_big_for_the_model(tmp_path, big_tokenizer, capsys):
    # a classifier's folder: one without a cls head is refused before its tokenizer is read (check_head)
    path = _model_dir(tmp_path / "m", "bert-base", 400, big_tokenizer, "classification", n_labels=2)
    data = tmp_path / "d.csv"
    data.write_text("text,label\ngood film,pos\nbad film,neg\n")
    assert_refused(capsys, ["evaluate", "--model", str(path), "--task", "cls", "--data", str(data)])


def test_generate_refuses_a_tokenizer_too_big_for_the_model(tmp_path, big_tokenizer, capsys):
    path = _model_dir(tmp_path / "m", "gpt2", 400, big_tokenizer)
    assert_refused(capsys, ["generate", "the cat", "--model", str(path), "--max-new-tokens", "2"])
