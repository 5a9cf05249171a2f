"""generate's own arguments beside the options (model, prompt dtype, use_cache, prefix_lm, generator,
streamer) are refused in one line naming the argument before any model call, never read loosely."""
import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError
from lmforge.heads import attach


@pytest.fixture(scope="module")
def gpt():
    model = lmforge.build("gpt2", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=50, max_seq_len=32)
    attach(model, "lm")
    return model


@pytest.fixture
def calls(gpt):
    """The forward calls made on the model during a test."""
    made = []
    hook = gpt.register_forward_pre_hook(lambda *a: made.append(1))
    yield made
    hook.remove()


@pytest.mark.parametrize("given, named", [
    ({"prefix_lm": "no"}, "prefix_lm"),  # a truthy text read the prompt bidirectionally, silently
    ({"prefix_lm": 1}, "prefix_lm"),
    ({"use_cache": None}, "use_cache"),
    ({"do_sample": True, "generator": 0}, "generator"),  # failed inside torch.multinomial
    ({"streamer": 3}, "streamer"),  # failed after the first step
    ({"projection": "fast"}, "projection"),  # a plain ValueError naming no field
    ({"projection": None}, "projection"),
])
def test_a_call_argument_of_the_wrong_kind_is_refused_naming_it_before_any_model_call(gpt, calls, given,
                                                                                      named):
    with pytest.raises(OptionsError) as err:
        lmforge.generate(gpt, torch.tensor([[5, 6, 7]]), max_new_tokens=2, **given)
    assert err.value.field == named and "\n" not in str(err.value) and not calls


@pytest.mark.parametrize("model", ["tiny-gpt", None])
def test_a_model_that_is_not_a_transformer_is_refused_naming_model(model):
    # was AttributeError: no attribute 'config'
    with pytest.raises(OptionsError, match="lmforge.load") as err:
        lmforge.generate(model, torch.tensor([[5, 6, 7]]))
    assert err.value.field == "model"


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.float32])
def test_a_prompt_that_is_not_token_ids_is_refused_in_one_line(gpt, calls, dtype):
    with pytest.raises(ValueError, match="input_ids must be a tensor of token ids") as err:  # bool and uint8
        # failed in the embedding
        lmforge.generate(gpt, torch.tensor([[1, 1, 0]]).to(dtype), max_new_tokens=2)
    assert str(dtype) in str(err.value) and not calls


def test_int32_token_ids_and_true_false_switches_generate_as_int64_ones_do(gpt):
    ids = torch.tensor([[5, 6, 7]])
    want = lmforge.generate(gpt, ids, max_new_tokens=3)
    assert torch.equal(lmforge.generate(gpt, ids.int(), max_new_tokens=3, use_cache=False, prefix_lm=False),
                       want)


def test_a_compiled_model_passes_the_check_as_the_model_it_wraps(gpt):
    """torch.compile's wrapper holds the Transformer (_orig_mod): generate ran it before the check came,
    so the check takes it (building the wrapper compiles nothing)."""
    from lmforge.generate.checks import check_call

    check_call(torch.compile(gpt), True, False, None, None)
    with pytest.raises(OptionsError, match="got OptimizedModule"):  # one that wraps no Transformer
        check_call(torch.compile(torch.nn.Linear(2, 2)), True, False, None, None)


@pytest.mark.parametrize("ids, said", [
    ([[1, 2, 3]], "got list"),
    (torch.tensor([1, 2, 3]), "got (3,) torch.int64"),
    (torch.tensor([[1.0, 2.0]]), "got (1, 2) torch.float32"),
    ("a prompt", "got str"),
])
def test_a_prompt_that_is_no_2d_tensor_of_ids_is_an_options_error_naming_input_ids(gpt, calls, ids, said):
    """A list, a 1-D, float or text prompt was a plain ValueError (no field, not the OptionsError of the
    other arguments)."""
    with pytest.raises(OptionsError, match=r"^input_ids must be a tensor of token ids") as err:
        lmforge.generate(gpt, ids, max_new_tokens=2)
    assert said in str(err.value) and err.value.field == "input_ids" and not calls


def test_an_encoder_is_refused_naming_model():
    encoder = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=50)
    attach(encoder, "lm")
    with pytest.raises(OptionsError, match="generation needs a decoder or an encoder-decoder") as err:
        lmforge.generate(encoder, torch.tensor([[5, 6, 7]]), max_new_tokens=2)
    assert err.value.field == "model"


def test_more_running_sequences_than_the_bound_are_refused_before_any_model_call(gpt, calls, monkeypatch):
    """200,000 prompts x 64 beams asked torch for 100 GB and failed as a RuntimeError naming nothing. The
    bound is lowered to 64 sequences here, so that a batch at it runs in milliseconds (65,536: seconds)."""
    from lmforge.generate import checks

    monkeypatch.setattr(checks, "MAX_SEQUENCES", 64)
    prompts = torch.full((64 // 4 + 1, 2), 5)  # just past the bound with 4 sequences each
    for given in ({"num_beams": 4}, {"do_sample": True, "num_return_sequences": 4}):
        with pytest.raises(OptionsError, match="^17 prompts x 4 sequences each is 68 sequences at once, more "
                                               "than 64: give fewer prompts a call$") as err:
            lmforge.generate(gpt, prompts, max_new_tokens=1, **given)
        assert err.value.field == "input_ids" and not calls
    out = lmforge.generate(gpt, prompts[:16], max_new_tokens=1, num_beams=4)
    assert out.shape == (16, 3) and calls  # at the bound: it runs


