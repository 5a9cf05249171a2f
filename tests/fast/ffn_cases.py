"""A small GELU feed-forward sub-layer and an input for it: what the FFN tests of fast/ run."""
import torch


def gelu_ffn(d_ff: int) -> tuple:
    """(FeedForward d_model 64 -> d_ff -> 64 with exact GELU, a (2, 40, 64) input), seeded."""
    from lmforge.config import ModelConfig
    from lmforge.layers.feedforward import FeedForward

    torch.manual_seed(0)
    return FeedForward(ModelConfig(d_model=64, n_heads=4, d_ff=d_ff, ffn="gelu")), torch.randn(2, 40, 64)
