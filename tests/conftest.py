"""Shared helpers: tiny models of every preset and inputs that fit them."""
from __future__ import annotations

import pytest
import torch

import lmforge
from lmforge.presets import PRESETS

ALL_PRESETS = list(PRESETS)


def tiny_model(name_or_cfg, **overrides) -> lmforge.Transformer:
    """A seeded, eval-mode tiny model of a preset (or of a ModelConfig)."""
    torch.manual_seed(0)
    cfg = name_or_cfg if isinstance(name_or_cfg, lmforge.ModelConfig) else lmforge.tiny(name_or_cfg)
    model = lmforge.build(cfg, **overrides)
    return model.eval()


def segments_for(cfg, ids: torch.Tensor):
    """Segment ids exercising every segment embedding (or XLNet's segment term), else None."""
    if cfg.n_segments >= 2 or cfg.position == "xl-relative":
        return (torch.arange(ids.shape[1]) >= 3).long().expand_as(ids)  # independent of padding
    return None


def forward(model, ids, mask=None, decoder_ids=None, decoder_mask=None, **kw):
    """Run any architecture; returns the ModelOutput."""
    cfg = model.config
    if cfg.architecture == "encoder-decoder":
        decoder_ids = ids if decoder_ids is None else decoder_ids
        return model(ids, mask, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask, **kw)
    if cfg.architecture == "encoder":
        return model(ids, mask, segment_ids=segments_for(cfg, ids), **kw)
    return model(ids, mask, **kw)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
