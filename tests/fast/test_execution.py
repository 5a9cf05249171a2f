"""fast/execution: the optimized forward packs a batch only where a plain forward's results and what
hooks see would not change."""
import pytest
import torch

import lmforge
from lmforge.fast.paths import FastPaths


def _batch(empty_row: bool):
    ids = torch.randint(3, 99, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    if empty_row:
        mask[2] = 0
    return ids, mask


def _outputs(model, ids, mask, fast: bool) -> torch.Tensor:
    lmforge.optimize(model, enabled=fast)
    kwargs = {"decoder_input_ids": ids[:, :5]} if model.config.architecture == "encoder-decoder" else {}
    with torch.no_grad():
        return model(ids, mask, **kwargs).last_hidden_state


@pytest.mark.parametrize("name", ["t5-small", "bart-base", "bert-base"])
def test_a_row_of_padding_only_gives_the_plain_results(name):
    """A decoder cross-attends to every row of such a row's memory, and a pooled head reads it: the
    plain forward computes them, packing would have left them zeros."""
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(name)).eval()
    ids, mask = _batch(empty_row=True)
    plain = _outputs(model, ids, mask, fast=False)
    fast = _outputs(model, ids, mask, fast=True)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("unpad", ["auto", "always"])
def test_a_hooked_layer_sees_the_padded_layout_and_the_plain_values(unpad):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base")).eval()
    ids, mask = _batch(empty_row=False)
    seen = []
    norm = model.encoder.blocks[0].attn_norm
    norm.register_forward_hook(lambda module, args, out: seen.append(out.clone()))
    _outputs(model, ids, mask, fast=False)
    lmforge.optimize(model, paths=FastPaths(unpad=unpad))
    with torch.no_grad():
        model(ids, mask)
    assert seen[1].shape == seen[0].shape == (*ids.shape, model.config.d_model)
    torch.testing.assert_close(seen[1], seen[0], rtol=1e-5, atol=1e-5)


def test_without_hooks_or_empty_rows_the_batch_is_packed():
    model = lmforge.optimize(lmforge.build(lmforge.tiny("bert-base")).eval())
    mask = _batch(empty_row=False)[1]
    assert model.execution.packing(model, mask.bool(), None, None, keep_padding=False) is not None
    model.register_forward_pre_hook(lambda module, args: None)  # the model's own: sees the padded batch
    assert model.execution.packing(model, mask.bool(), None, None, keep_padding=False) is not None


def _left_padded():
    ids, mask = _batch(empty_row=False)
    mask[0, :4] = 0  # row 0 starts with padding: position 0 is no real token
    return ids, mask


@pytest.mark.parametrize("name", ["gpt2", "bert-base"])
def test_a_first_pooled_head_on_a_left_padded_batch_reads_the_plain_position_0(name):
    """Packing left position 0 of a left-padded row zeros, which a pooling="first" head then read."""
    from lmforge.heads import attach

    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(name)).eval()
    attach(model, "classification", n_labels=3, pooling="first")
    ids, mask = _left_padded()
    logits = []
    for fast in (False, True):
        lmforge.optimize(model, enabled=fast)
        with torch.no_grad():
            logits.append(model(ids, mask).logits)
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)
    right = _batch(empty_row=False)[1].bool()  # right padding: position 0 is real, the batch is packed
    assert model._heads_read(True) == {"keep_padding": False, "reads_first": True}
    assert model._packing(right, None, None, reads_first=True) is not None
    assert model._packing(mask.bool(), None, None, reads_first=True) is None


def test_recorded_attention_maps_are_the_plain_ones_padded_rows_included():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base")).eval()
    ids, mask = _left_padded()
    maps = []
    for fast in (False, True):
        lmforge.optimize(model, enabled=fast)
        with torch.no_grad():
            maps.append(model(ids, mask, return_attention=True).attentions)
    for fast_map, plain_map in zip(maps[1], maps[0]):
        torch.testing.assert_close(fast_map, plain_map, rtol=1e-5, atol=1e-5)
