"""Int8Embedding: a token table stored int8 per row, beside quant/int8.py's Int8Linear."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.quant.int8 import quantise_per_channel


class Int8Embedding(nn.Module):
    """A token table stored int8 per row (buffers qweight, scale): a lookup dequantises only the rows
    it reads. For a table no LM head projects with (an encoder's: half of all-MiniLM-L6-v2's weights)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.register_buffer("qweight", torch.zeros(num_embeddings, embedding_dim, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(num_embeddings))

    @classmethod
    def from_embedding(cls, table: nn.Embedding, quantise: bool = True) -> Int8Embedding:
        """The int8 form of `table` (quantise=False: the shapes only, to load into)."""
        module = cls(table.num_embeddings, table.embedding_dim).to(table.weight.device)
        if quantise:
            q, scale = quantise_per_channel(table.weight)
            module.qweight.copy_(q)
            module.scale.copy_(scale)
        return module

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised (V, E) fp32 table, a fresh tensor."""
        return self.qweight.float() * self.scale[:, None]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (...) -> (..., E)
        return F.embedding(ids, self.qweight).float().mul_(self.scale[ids].unsqueeze(-1))


def swap_tokens(model: nn.Module, quantise: bool = True) -> None:
    """Replace the model's token table (model.tokens) by an Int8Embedding (a ValueError naming it where its
    weight holds NaN or inf, which int8 cannot hold)."""
    try:
        model.tokens = Int8Embedding.from_embedding(model.tokens, quantise)
    except ValueError as err:
        raise ValueError(f"tokens.weight: {err}") from None
