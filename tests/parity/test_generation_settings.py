"""Decoding settings against the reference library's `generate`: each setting lmforge accepts gives the
reference's tokens on a model converted from it; one it cannot give them for is refused, naming it."""
import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError
from lmforge.generate import generate

from tests.parity.helpers import left_padded_batch, save_reference, transformers


def _converted(reference, norm, path):
    """(reference, lmforge's model read from it), the final norm scaled first so that next-token scores are
    rarely near ties; the reference's own generation defaults are cleared: every setting is given."""
    with torch.no_grad():
        norm.weight.mul_(8.0)
        norm.bias.mul_(8.0)
    model = lmforge.load(save_reference(reference.eval(), path))
    reference.generation_config = transformers.GenerationConfig()
    return reference, model


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0,
        pad_token_id=1))
    return _converted(reference, reference.transformer.ln_f, tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    torch.manual_seed(0)
    reference = transformers.BartForConditionalGeneration(transformers.BartConfig(  # forced_eos_token_id=2
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64))
    norm = reference.model.decoder.layers[-1].final_layer_norm
    return _converted(reference, norm, tmp_path_factory.mktemp("bart"))


def _theirs(reference, ids, mask, **settings):
    """The reference's tokens with `settings`, its other processors off."""
    neutral = dict(do_sample=False, num_beams=1, min_length=0, repetition_penalty=1.0, no_repeat_ngram_size=0,
                   forced_bos_token_id=None, forced_eos_token_id=None, suppress_tokens=None)
    return reference.generate(ids, attention_mask=mask, **{**neutral, **settings})


@pytest.mark.parametrize("min_new_tokens, extra", [(2, 0), (2, 1), (5, 0)])
def test_min_length_with_min_new_tokens_gives_the_reference_tokens_or_is_refused(gpt2, min_new_tokens, extra):
    """The reference applies min_new_tokens alone when both are given: a min_length it already implies is
    served with its tokens; one asking more would be dropped there, so it is refused here, by name."""
    reference, model = gpt2
    ids, mask = left_padded_batch(100, lengths=(5, 3), pad=1)
    start = ids.shape[1]
    stop = int(generate(model, ids, mask, max_new_tokens=1, eos_token_id=99)[0, start])  # row 0's first
    settings = dict(max_new_tokens=8, eos_token_id=stop, pad_token_id=1, min_new_tokens=min_new_tokens,
                    min_length=start + min_new_tokens + extra)
    if extra:
        with pytest.raises(OptionsError, match="give one of them") as err:
            generate(model, ids, mask, **settings)
        assert err.value.field == "min_length" and "\n" not in str(err.value)
        return
    ours = generate(model, ids, mask, **settings)
    assert torch.equal(ours, _theirs(reference, ids, mask, **settings))
    assert stop not in ours[:, start:start + min_new_tokens].tolist()[0]  # held back: row 0 began with it


@pytest.mark.parametrize("settings, named", [
    (dict(forced_eos_token_id=7, suppress_tokens=[7, 9]), "forced_eos_token_id"),
    (dict(forced_bos_token_id=9, suppress_tokens=[9]), "forced_bos_token_id"),
    (dict(suppress_tokens=[2]), "forced_eos_token_id"),  # BART's config forces eos 2 at the last position
])
def test_a_forced_token_that_is_also_suppressed_is_refused_by_name(bart, settings, named):
    """Every score of the forced step was -inf: greedy decoding took token 0, unsaid; the reference
    refuses."""
    reference, model = bart
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    with pytest.raises(OptionsError, match="also in suppress_tokens") as err:
        generate(model, ids, max_new_tokens=4, eos_token_id=2, **settings)
    assert err.value.field == named and "\n" not in str(err.value)
    resolved = {"forced_eos_token_id": 2, **settings}  # the config's forced eos, given to the reference
    with pytest.raises(ValueError, match="is also in `suppress_tokens`"):
        _theirs(reference, ids, None, max_new_tokens=4, eos_token_id=2, **resolved)


BEAMS = [dict(num_beams=3, num_return_sequences=2, length_penalty=-1.0, early_stopping=False),
         dict(num_beams=4, num_return_sequences=3, length_penalty=2.0, early_stopping="never",
              no_repeat_ngram_size=2),
         dict(num_beams=2, length_penalty=0.0, early_stopping=True, repetition_penalty=1.3, min_new_tokens=3),
         dict(num_beams=1, no_repeat_ngram_size=1, suppress_tokens=[8], forced_bos_token_id=38,
              decoder_start_token_id=0)]


@pytest.mark.parametrize("settings", BEAMS)
def test_beam_and_processor_settings_give_the_reference_tokens(bart, settings):
    """An encoder-decoder with a config-forced eos, padded inputs and a list of stop ids."""
    reference, model = bart
    ids, mask = left_padded_batch(100, lengths=(6, 4, 2), pad=1)
    mask = mask.flip(1)  # an encoder's padding may be on the right
    ids = torch.where(mask.bool(), ids.flip(1), 1)
    given = dict(max_new_tokens=8, eos_token_id=[38, 2], pad_token_id=1, **settings)
    ours = generate(model, ids, mask, **given)
    theirs = _theirs(reference, ids, mask, **{"forced_eos_token_id": 2, "decoder_start_token_id": 2, **given})
    assert torch.equal(ours, theirs)


SAMPLING = [dict(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3),
            dict(temperature=3.0, top_p=0.6, no_repeat_ngram_size=2, min_new_tokens=3),
            dict(temperature=2.0, top_k=5, suppress_tokens=[8], repetition_penalty=0.8)]


@pytest.mark.parametrize("settings", SAMPLING)
def test_sampling_seeded_alike_gives_the_reference_tokens(gpt2, settings):
    """The processed distribution is the reference's bit for bit and drawn from alike, so the same seed
    samples the same tokens (top_k given: the reference's unset default is 50, lmforge's 0, all)."""
    reference, model = gpt2
    ids, mask = left_padded_batch(100, lengths=(6, 4, 2), pad=1)
    ids, mask = ids.repeat(20, 1), mask.repeat(20, 1)
    given = dict(max_new_tokens=6, do_sample=True, eos_token_id=0, pad_token_id=1, **{"top_k": 0, **settings})
    torch.manual_seed(3)
    ours = generate(model, ids, mask, **given)
    torch.manual_seed(3)
    assert torch.equal(ours, _theirs(reference, ids, mask, **given))
    # sampled, not one text per prompt
    assert len({tuple(row) for row in ours[:, ids.shape[1]:].tolist()}) > 6


def test_a_checkpoint_recommending_sampling_samples_as_the_reference_reads_it(tmp_path):
    """A reference file naming no top_k samples among the reference's default 50 most probable (its files
    leave the default out), whether the file or the call asks for sampling; lmforge's own default, 0,
    had sampled among all 100."""
    from lmforge.generate.options import GenerationOptions

    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0,
        pad_token_id=1)).eval()
    reference.generation_config = transformers.GenerationConfig(
        do_sample=True, temperature=3.0, pad_token_id=1, eos_token_id=0, max_new_tokens=6)
    path = save_reference(reference, tmp_path / "sampling")
    assert "top_k" not in (path / "generation_config.json").read_text()
    options = GenerationOptions.load(path, start=6)
    assert options.do_sample and options.top_k == 50
    ids, mask = left_padded_batch(100, lengths=(6, 4, 2), pad=1)
    ids, mask, model = ids.repeat(20, 1), mask.repeat(20, 1), lmforge.load(path)
    torch.manual_seed(5)
    ours = generate(model, ids, mask, options=options)
    torch.manual_seed(5)
    assert torch.equal(ours, reference.generate(ids, attention_mask=mask))
    # a file recommending greedy: sampling asked for samples among the reference's 50 too
    reference.generation_config = transformers.GenerationConfig(
        pad_token_id=1, eos_token_id=0, max_new_tokens=6)
    save_reference(reference, path)
    options = GenerationOptions.load(path, start=6)
    assert not options.do_sample and options.top_k == 50
    torch.manual_seed(6)
    ours = generate(model, ids, mask, options=options, do_sample=True, temperature=3.0)
    torch.manual_seed(6)
    assert torch.equal(ours, reference.generate(ids, attention_mask=mask, do_sample=True, temperature=3.0))
