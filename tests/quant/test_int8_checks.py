"""quant/int8_checks: what quantise_per_channel makes is what a load accepts, and nothing else."""
import torch

from lmforge.quant.int8 import Int8Linear, quantise_per_channel
from lmforge.quant.int8_checks import stored_int8_problem
from lmforge.quant.int8_embedding import Int8Embedding


def _state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(Int8Linear.from_linear(torch.nn.Linear(16, 8)),
                                Int8Embedding.from_embedding(torch.nn.Embedding(10, 16)))
    own = model.state_dict()
    return own, {k: v.clone() for k, v in own.items()}


def test_quantisation_is_symmetric_and_what_it_writes_is_accepted():
    q, scale = quantise_per_channel(torch.tensor([[-3.0, 1.0, 0.5], [0.0, 0.0, 0.0], [2.0, -2.0, 1e-9]]))
    assert int(q.min()) == -127 and int(q.max()) == 127 and bool((scale > 0).all())
    own, tensors = _state()
    assert stored_int8_problem(own, tensors) is None


def test_a_stored_minus_128_or_a_bad_scale_is_named_in_either_int8_layer():
    for name in ("0.qweight", "1.qweight"):
        own, tensors = _state()
        tensors[name][2, 3] = -128
        assert stored_int8_problem(own, tensors) == \
            f"{name} holds -128, outside the [-127, 127] int8 weights are quantised to"
    own, tensors = _state()
    tensors["1.scale"][4] = 0.0
    assert stored_int8_problem(own, tensors) == "1.scale holds a scale that is not positive"


def test_a_stored_smoothing_factor_that_is_not_positive_is_named():
    """x / s with s <= 0 gave inf or a flipped input channel, loaded with nothing said."""
    torch.manual_seed(0)
    layer = Int8Linear.from_linear(torch.nn.Linear(16, 8), smooth=torch.rand(16) + 0.5)
    own = layer.state_dict()
    assert stored_int8_problem(own, dict(own)) is None
    for bad in (0.0, -2.0):
        tensors = {k: v.clone() for k, v in own.items()}
        tensors["smooth"][5] = bad
        assert stored_int8_problem(own, tensors) == "smooth holds a smoothing factor that is not positive"
