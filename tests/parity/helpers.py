"""Helpers for parity against the reference library (tiny random models, nothing downloaded)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")


def save_reference(model, path):
    """Save a reference model the way users receive them (config.json + safetensors)."""
    model.eval().save_pretrained(path)
    return path


def padded_batch(vocab: int, lengths=(9, 6, 3), seed: int = 0):
    """(B, T) ids and a right-padded attention mask."""
    gen = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), T), generator=gen)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    return ids, mask


def assert_parity(ours, theirs, mask=None):
    """fp32 parity: absolute 1e-5, relative 1e-4 (at real positions when a mask is given)."""
    if mask is not None:
        keep = mask.bool()
        ours, theirs = ours[keep], theirs[keep]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def left_padded_batch(vocab: int, lengths=(7, 4, 2), pad: int = 1, seed: int = 0):
    """(B, T) ids with `pad` before each prompt, and the left-padded attention mask (generation)."""
    gen = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(pad + 2, vocab, (len(lengths), T), generator=gen)
    mask = (torch.arange(T)[None] >= T - torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, pad), mask


def assert_greedy_parity(model, reference, ids, mask, max_new_tokens: int = 20):
    """Greedy tokens equal to reference.generate, with the configs' eos and again with a stop
    token that row 0 really produces (its third new token: the row ends early and is padded)."""
    import lmforge

    free = reference.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False)
    assert torch.equal(lmforge.generate(model, ids, mask, max_new_tokens=max_new_tokens), free)
    stop = int(free[0, ids.shape[1] + 2])
    theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                eos_token_id=stop)
    ours = lmforge.generate(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=stop)
    assert torch.equal(ours, theirs)
    assert (theirs[0, ids.shape[1] + 3:] == reference.config.pad_token_id).all()  # row 0 stopped


def assert_causal_lm_parity(model, reference, ids, mask):
    """Last hidden states, logits and the shifted next-token loss (padding ignored) of a causal LM."""
    import torch.nn.functional as F

    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        ours = model(ids, mask)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.logits, theirs.logits, mask)
    loss = F.cross_entropy(ours.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def assert_export_round_trip(model, reference_class, path, ids, mask, reference=None):
    """model.save(format="hf"): the reference loads it with the same outputs (and, given the
    reference it was imported from, the same tensors); lmforge reloads the same state dict."""
    import lmforge

    model.save(path, format="hf")
    back = reference_class.from_pretrained(path).eval()
    with torch.no_grad():
        ours, theirs = model(ids, mask), back(ids, attention_mask=mask)
    assert_parity(ours.logits, theirs.logits, mask if ours.logits.dim() == 3 else None)
    if reference is not None:
        want, got = reference.state_dict(), back.state_dict()
        assert sorted(want) == sorted(got)
        assert all(torch.equal(want[k], got[k]) for k in want)
    state = lmforge.load(path).state_dict()
    assert sorted(state) == sorted(model.state_dict())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
