"""XLNet's two-stream attention and segment-recurrence memory against XLNetLMHeadModel."""
import pytest
import torch

import lmforge
from tests.parity.helpers import assert_parity, load_reference, padded_batch, transformers

LENGTHS = (9, 6, 3)


def _reference(architecture="XLNetLMHeadModel", **kw):
    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=64, **kw)
    return getattr(transformers, architecture)(cfg).eval()


def _permutation_inputs(lengths=LENGTHS, n_predict=3, seed=0):
    """A random factorisation order per example: perm_mask (1 = i may not see j, i.e. j is not
    earlier in the order), and the last n_predict positions of each order as targets."""
    gen = torch.Generator().manual_seed(seed)
    T = max(lengths)
    perm_mask = torch.ones(len(lengths), T, T)
    target_mapping = torch.zeros(len(lengths), n_predict, T)
    for b, n in enumerate(lengths):
        order = torch.randperm(n, generator=gen)
        rank = torch.empty(n, dtype=torch.long)
        rank[order] = torch.arange(n)
        perm_mask[b, :n, :n] = (rank[None, :] >= rank[:, None]).float()
        for m, position in enumerate(order[-n_predict:][:n].tolist()):
            target_mapping[b, m, position] = 1.0
    return perm_mask, target_mapping


def _labels(ids, target_mapping):
    """The tokens at the targets; -100 for prediction rows that map nowhere (padding)."""
    labels = torch.einsum("bnt,bt->bn", target_mapping, ids.float()).long()
    return labels.masked_fill(target_mapping.sum(-1) == 0, -100)


def test_query_stream_logits_and_loss_on_a_padded_batch_with_segments(tmp_path):
    reference = _reference()
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99)
    segments = (torch.arange(ids.shape[1]) >= 4).long().expand_as(ids)
    perm_mask, target_mapping = _permutation_inputs(n_predict=4)  # the 3-token example pads one row
    labels = _labels(ids, target_mapping)
    assert (labels == -100).sum() == 1
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, token_type_ids=segments, perm_mask=perm_mask,
                           target_mapping=target_mapping, labels=labels, use_mems=False)
        ours = model(ids, mask, segment_ids=segments, perm_mask=perm_mask, target_mapping=target_mapping)
    assert ours.logits.shape == (3, 4, 99)
    assert_parity(ours.logits, theirs.logits)
    loss = torch.nn.functional.cross_entropy(ours.logits.flatten(0, 1), labels.flatten())
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def test_target_mapping_without_perm_mask_or_padding(tmp_path):
    reference = _reference()
    model = load_reference(reference, tmp_path)
    ids, _ = padded_batch(99, lengths=(7, 7), seed=4)
    target_mapping = torch.zeros(2, 2, 7)
    target_mapping[0, 0, 3] = target_mapping[0, 1, 0] = target_mapping[1, 0, 6] = 1.0
    with torch.no_grad():
        theirs = reference(ids, target_mapping=target_mapping, use_mems=False).logits
        ours = model(ids, target_mapping=target_mapping).logits
    assert_parity(ours, theirs)


def test_perm_mask_alone_restricts_the_content_stream(tmp_path):
    reference = _reference("XLNetModel")
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, seed=1)
    perm_mask, _ = _permutation_inputs(seed=1)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, perm_mask=perm_mask, use_mems=False).last_hidden_state
        ours = model(ids, mask, perm_mask=perm_mask).last_hidden_state
        unmasked = model(ids, mask).last_hidden_state
    assert_parity(ours, theirs, mask)
    assert (ours - unmasked)[mask.bool()].abs().max() > 1e-3  # the order did change something


def test_memory_of_the_previous_segment(tmp_path):
    reference = _reference(mem_len=5)
    model = load_reference(reference, tmp_path)
    first, _ = padded_batch(99, lengths=(8, 8, 8), seed=2)
    second, mask = padded_batch(99, seed=3)
    perm_mask, target_mapping = _permutation_inputs(seed=3)
    with torch.no_grad():
        theirs_1 = reference(first, use_mems=True)
        ours_1 = model(first, mem_len=5)
        for want, got in zip(theirs_1.mems, ours_1.mems):
            assert got.shape == (3, 5, 32)
            assert_parity(got, want.transpose(0, 1))  # the reference keeps (M, B, d)
        theirs_2 = reference(second, attention_mask=mask, mems=theirs_1.mems, perm_mask=perm_mask,
                             target_mapping=target_mapping, use_mems=True)
        # lmforge's mask covers memory + new positions, as with a KV cache
        full_mask = torch.cat([torch.ones(3, 5, dtype=mask.dtype), mask], dim=1)
        ours_2 = model(second, full_mask, mems=ours_1.mems, mem_len=5, perm_mask=perm_mask,
                       target_mapping=target_mapping)
        plain = model(second, mask, perm_mask=perm_mask, target_mapping=target_mapping)
    assert_parity(ours_2.logits, theirs_2.logits)
    assert (ours_2.logits - plain.logits).abs().max() > 1e-3  # the memory was attended
    real = torch.cat([torch.ones(3, 5, dtype=mask.dtype), mask], dim=1)[:, -5:]  # new memory's real rows
    for want, got in zip(theirs_2.mems, ours_2.mems):
        assert_parity(got, want.transpose(0, 1), real)


def test_memory_is_detached_and_training_gets_gradients_through_the_query_stream():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("xlnet-base"))
    ids, mask = padded_batch(99, seed=5)
    perm_mask, target_mapping = _permutation_inputs(seed=5)
    first = model(ids, mask, mem_len=4, run_heads=False)
    assert all(not m.requires_grad for m in first.mems)
    out = model(ids, torch.cat([torch.ones(3, 4, dtype=mask.dtype), mask], 1), mems=first.mems,
                perm_mask=perm_mask, target_mapping=target_mapping, run_heads=False)
    # a fixed random direction: the plain sum of a LayerNorm output has zero gradient (up to rounding)
    direction = torch.randn(out.last_hidden_state.shape, generator=torch.Generator().manual_seed(1))
    (out.last_hidden_state * direction).sum().backward()
    assert model.embed.query_init.grad is not None and model.embed.query_init.grad.abs().sum() > 1e-3


def test_bad_two_stream_inputs_are_refused():
    torch.manual_seed(0)
    xlnet, bert = lmforge.build(lmforge.tiny("xlnet-base")), lmforge.build(lmforge.tiny("bert-base"))
    ids, mask = padded_batch(99)
    with pytest.raises(ValueError, match="xl-relative"):
        bert(ids, mask, perm_mask=torch.zeros(3, 9, 9))
    with pytest.raises(ValueError, match="perm_mask"):
        xlnet(ids, mask, perm_mask=torch.zeros(3, 9, 8))
    with pytest.raises(ValueError, match="target_mapping"):
        xlnet(ids, mask, target_mapping=torch.zeros(3, 9))
    with pytest.raises(ValueError, match="mems"):
        xlnet(ids, mask, mems=[torch.zeros(3, 2, 32)])
    with pytest.raises(ValueError, match="mem_len"):
        xlnet(ids, mask, mem_len=0)
    with pytest.raises(ValueError, match="mem_len"):
        xlnet(ids, mask, mem_len=2.5)
    with pytest.raises(ValueError, match="mems must have d_model=32"):  # not a matmul's shape error
        xlnet(ids, None, mems=[torch.zeros(3, 2, 16)] * 2)


@pytest.mark.parametrize("perm", [False, True])
def test_padded_rows_see_themselves_and_become_the_reference_memory(tmp_path, perm):
    reference = _reference(mem_len=6)
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, seed=6)
    ids, mask = ids.flip(1), mask.flip(1)  # left padding
    perm_mask = _permutation_inputs(seed=6)[0].flip(1, 2) if perm else None
    second, second_mask = padded_batch(99, seed=7)
    with torch.no_grad():
        theirs_1 = reference(ids, attention_mask=mask, perm_mask=perm_mask, use_mems=True)
        ours_1 = model(ids, mask, perm_mask=perm_mask, mem_len=6)
        # the reference's memory is always visible, its padded rows included
        theirs_2 = reference(second, attention_mask=second_mask, mems=theirs_1.mems, use_mems=True).logits
        ours_2 = model(second, torch.cat([torch.ones(3, 6, dtype=mask.dtype), second_mask], 1),
                       mems=ours_1.mems).logits
    assert_parity(ours_1.logits, theirs_1.logits)  # every row, padding too
    for want, got in zip(theirs_1.mems, ours_1.mems):
        assert_parity(got, want.transpose(0, 1))
    assert_parity(ours_2, theirs_2, second_mask)


def test_a_target_that_sees_nothing_averages_every_row_as_the_reference_does(tmp_path):
    reference = _reference()
    model = load_reference(reference, tmp_path)
    ids, mask = torch.tensor([[5, 7], [9, 11]]), torch.tensor([[1, 1], [0, 1]])
    perm_mask = torch.tensor([[[1., 0.], [1., 1.]]]).expand(2, 2, 2)  # position 1 sees no other
    target_mapping = torch.tensor([[[1., 0.]], [[0., 1.]]])
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, perm_mask=perm_mask, target_mapping=target_mapping,
                           use_mems=False).logits
        ours = model(ids, mask, perm_mask=perm_mask, target_mapping=target_mapping).logits
    assert_parity(ours, theirs)


def test_perm_mask_is_thresholded_as_the_reference_does(tmp_path):
    reference = _reference("XLNetModel")
    model = load_reference(reference, tmp_path)
    ids, mask = padded_batch(99, seed=8)
    perm_mask = _permutation_inputs(seed=8)[0]
    perm_mask[0, 1] = float("nan")  # the reference's `> 0` leaves NaN and negative entries visible
    perm_mask[1, 0] = -1.0
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, perm_mask=perm_mask, use_mems=False).last_hidden_state
        ours = model(ids, mask, perm_mask=perm_mask).last_hidden_state
    assert_parity(ours, theirs, mask)
