"""Mistral (Jiang et al. 2023) in the reference library's layout: model_type "mistral".

The Llama layout (llama.py) with a causal sliding window: the reference's `sliding_window`
w lets query i see keys i-w < j <= i (w keys, itself included), which is lmforge's
`attention="sliding-window"` with `window=w`. No biases anywhere.
"""
from __future__ import annotations

from lmforge.config import ModelConfig
from lmforge.convert import llama
from lmforge.convert.family import Family


def config(hf: dict) -> ModelConfig:
    """MistralConfig fields -> ModelConfig."""
    window = hf.get("sliding_window")
    if window is None or window >= hf["max_position_embeddings"]:  # a window that never binds
        return llama.decoder_config(hf)
    return llama.decoder_config(hf, attention="sliding-window", window=window)


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> MistralConfig fields (`family_of` checks that they express `cfg` exactly)."""
    windowed = cfg.attention == "sliding-window"
    return dict(llama.decoder_reference(cfg), sliding_window=cfg.window if windowed else None)


FAMILY = Family(
    model_types=("mistral",),
    prefix="model.",
    config=config,
    backbone=llama.backbone,
    heads=llama.decoder_heads("Mistral"),
    head_rules=llama.head_rules,
    to_reference=to_reference,
    bare=("MistralModel",),
    head_keys=llama.FAMILY.head_keys,
    ignore=llama.FAMILY.ignore,
    refine=llama.FAMILY.refine,
)
