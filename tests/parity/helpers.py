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
