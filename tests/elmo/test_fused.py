"""ELMo's fused LSTM path (one torch.lstm call per layer and direction) against the step-by-step reference."""
import pytest
import torch

from lmforge.layers.variants.elmo import ProjectedLSTM
from lmforge.tokenizer.chars import sentence_chars
from tests.elmo.test_model import tiny_elmo

SENTENCES = [["the", "cat", "sat"], ["a", "dog"], ["birds", "fly", "south", "in", "winter", "time"]]


def _layer(cell_clip=None, proj_clip=None):
    torch.manual_seed(0)
    layer = ProjectedLSTM(6, 5, 7, cell_clip, proj_clip)
    layer.reset_parameters()
    with torch.no_grad():
        layer.state_linearity.bias.normal_()  # every gate's bias reaches the result
    return layer


@pytest.mark.parametrize("with_state", [False, True])
def test_fused_layer_equals_the_reference_outputs_finals_and_gradients(with_state):
    layer = _layer()
    x = torch.randn(4, 6, 6)
    mask = torch.arange(6)[None] < torch.tensor([6, 3, 1, 0])[:, None]  # right padding, one empty row
    state = (torch.randn(4, 5), torch.randn(4, 7)) if with_state else None
    results = []
    for mode in ("off", "on"):
        layer.fused = mode
        xi = x.clone().requires_grad_()
        out, (h, c) = layer(xi, mask, state)
        (out.square().sum() + h.sum() + c.sum()).backward()
        results.append((out, h, c, xi.grad, layer.input_linearity.weight.grad.clone()))
        layer.zero_grad()
    for ref, fused in zip(*results):
        torch.testing.assert_close(fused, ref, atol=1e-5, rtol=1e-5)
    assert results[1][0][3].abs().sum() == 0  # padding (and the empty row) stays zero


def test_fused_elmo_equals_the_step_by_step_elmo_without_clips():
    model = tiny_elmo(cell_clip=None, proj_clip=None)
    chars, mask = sentence_chars(SENTENCES, model.config.max_characters_per_token)
    ref = model.set_fused_lstm("off")(chars, mask).layers()
    fused = model.set_fused_lstm("on")(chars, mask).layers()
    torch.testing.assert_close(fused, ref, atol=1e-5, rtol=1e-5)


def test_auto_stays_step_by_step_on_the_cpu_and_with_clips():
    assert not _layer().use_fused(torch.device("cpu"))
    assert _layer().use_fused(torch.device("cuda"))  # auto fuses an unclipped layer on CUDA
    assert not _layer(cell_clip=3.0).use_fused(torch.device("cuda"))
    assert not _layer(proj_clip=3.0).use_fused(torch.device("cuda"))


def test_on_with_clips_and_unknown_modes_are_refused():
    model = tiny_elmo(cell_clip=3.0, proj_clip=3.0)
    with pytest.raises(ValueError, match="cannot clip between steps"):
        model.set_fused_lstm("on")
    with pytest.raises(ValueError, match="fused_lstm must be one of"):
        model.set_fused_lstm("fast")
