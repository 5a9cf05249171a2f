"""quant/int8's quantisation: weights int8 cannot hold are refused, never made into other numbers."""
import pytest
import torch

from lmforge.quant.int8 import Int8Linear, quantise_per_channel, swap_linears
from lmforge.quant.int8_embedding import swap_tokens


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_weight_is_refused_naming_its_layer_and_nothing_is_swapped(value):
    """A NaN row had become zeros of scale 1 and an inf row zeros: an int8 model of other outputs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    with torch.no_grad():
        model[1].weight[2, 3] = value
    with pytest.raises(ValueError, match=r"^1\.weight holds non-finite values"):
        swap_linears(model, "dynamic")
    assert all(isinstance(m, torch.nn.Linear) for m in model)  # left whole
    with pytest.raises(ValueError, match="non-finite"):
        quantise_per_channel(model[1].weight)
    assert swap_linears(model, "dynamic", skip=("1",)) == ["0"]  # a layer kept fp32 is not judged
    assert isinstance(model[0], Int8Linear)


def test_a_non_finite_token_table_is_refused_naming_it():
    model = torch.nn.Module()
    model.tokens = torch.nn.Embedding(10, 8)
    with torch.no_grad():
        model.tokens.weight[4, 1] = float("nan")
    with pytest.raises(ValueError, match=r"^tokens\.weight: the weight holds non-finite values"):
        swap_tokens(model)
    assert isinstance(model.tokens, torch.nn.Embedding)
    swap_tokens(model, quantise=False)  # room to load into: nothing judged
