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


def test_auto_fuses_on_cuda_only_and_unknown_modes_are_refused():
    assert not _layer().use_fused(torch.device("cpu"))
    assert _layer().use_fused(torch.device("cuda")) and _layer(cell_clip=3.0).use_fused(torch.device("cuda"))
    with pytest.raises(ValueError, match="fused_lstm must be one of"):
        tiny_elmo().set_fused_lstm("fast")


def _run(layer, mode, x, mask, state):
    layer.fused = mode
    xi = x.clone().requires_grad_()
    out, (h, c) = layer(xi, mask, state)
    (out.square().sum() + h.sum() + c.sum()).backward()
    grads = (xi.grad, layer.input_linearity.weight.grad.clone(), layer.state_linearity.bias.grad.clone())
    layer.zero_grad()
    return (out, h, c, *grads), layer.last_run


@pytest.mark.parametrize("cell_clip, proj_clip, path", [
    (50.0, 50.0, "fused"),  # clips set but never reached: the fused run is the clipped layer's
    (0.3, None, "steps"),  # the cell clip acts: step by step again
    (None, 0.2, "steps"),  # the output clip acts
    (0.3, 0.2, "steps")])
def test_a_clipped_layer_runs_fused_exactly_where_no_clip_acts_and_step_by_step_elsewhere(
        cell_clip, proj_clip, path):
    layer = _layer(cell_clip, proj_clip)
    x = torch.randn(4, 6, 6) * 2
    mask = torch.arange(6)[None] < torch.tensor([6, 3, 1, 0])[:, None]
    state = (torch.randn(4, 5) * 0.1, torch.randn(4, 7) * 0.1)
    ref, ran = _run(layer, "off", x, mask, state)
    got, tried = _run(layer, "on", x, mask, state)
    assert ran == "steps" and tried == path
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_clip_check_sees_a_cell_past_its_clip_that_no_output_shows():
    """No output clip: only the rebuilt cells can tell that the cell clip acted."""
    layer = _layer(cell_clip=1.0)
    with torch.no_grad():
        layer.state_linearity.bias.zero_()
        layer.state_linearity.bias[7:14] = 6.0  # forget gate ~1: the cell accumulates ...
    x = torch.full((1, 6, 6), 0.5)
    _, tried = _run(layer, "on", x, torch.ones(1, 6, dtype=torch.bool), None)
    assert tried == "steps"


def test_original_elmo_with_its_clips_runs_fused_where_they_do_not_act():
    model = tiny_elmo(cell_clip=3.0, proj_clip=3.0)
    chars, mask = sentence_chars(SENTENCES, model.config.max_characters_per_token)
    ref = model.set_fused_lstm("off")(chars, mask).layers()
    fused = model.set_fused_lstm("on")(chars, mask).layers()
    torch.testing.assert_close(fused, ref, atol=1e-5, rtol=1e-5)
    runs = {layer.last_run for layer in (*model.lstm.forward_layers, *model.lstm.backward_layers)}
    assert runs == {"fused"}
