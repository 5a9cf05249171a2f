"""Building blocks of the one configurable Transformer, each chosen by a ModelConfig field."""
from lmforge.layers.attention import Attention, AttentionContext, DenseKernel, KVCache, attend
from lmforge.layers.block import Block
from lmforge.layers.embeddings import Embeddings
from lmforge.layers.feedforward import FeedForward
from lmforge.layers.norms import RMSNorm, make_norm

__all__ = ["Attention", "AttentionContext", "DenseKernel", "KVCache", "attend", "Block", "Embeddings",
           "FeedForward", "RMSNorm", "make_norm"]
