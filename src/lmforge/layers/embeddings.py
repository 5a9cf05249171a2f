"""Input embeddings: token (+ segment) (+ absolute position), norm, dropout, E -> d_model projection."""
from __future__ import annotations

import math

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.layers.norms import make_norm
from lmforge.layers.positions import ABSOLUTE


class Embeddings(nn.Module):
    """Everything between token vectors and the first block, for one stack.

    The token table itself belongs to the model so that an encoder-decoder's two stacks
    (and a tied LM head) share it; this module adds segments (BERT's token types),
    absolute positions, BERT's embedding norm and dropout, and ALBERT's factorised
    projection from E up to d_model (Lan et al. 2020, sec. 3.1)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        E = cfg.embed_dim
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.segments = nn.Embedding(cfg.n_segments, E) if cfg.n_segments else None
        self.positions = ABSOLUTE[cfg.position](cfg, E) if cfg.position in ABSOLUTE else None
        self.norm = make_norm(cfg, E) if cfg.embedding_norm else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.project = nn.Linear(E, cfg.d_model) if E != cfg.d_model else None
        # XLNet's query stream starts from one trainable vector w, g_i^(0) = w (Yang et al. 2019
        # sec. 2.3); it belongs to the embeddings so checkpoints keep it
        self.query_init = (nn.Parameter(torch.zeros(1, 1, cfg.d_model))
                           if cfg.position == "xl-relative" else None)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor,
                segment_ids: torch.Tensor | None) -> torch.Tensor:
        """tokens (B, T, E) token vectors; position_ids (B|1, T) -> (B, T, d_model)."""
        x = tokens * self.scale if self.scale != 1.0 else tokens
        if self.segments is not None:
            if segment_ids is None:
                segment_ids = torch.zeros(tokens.shape[:2], dtype=torch.long, device=tokens.device)
            x = x + self.segments(segment_ids)
        if self.positions is not None:
            x = x + self.positions(position_ids)
        if self.norm is not None:
            x = self.norm(x)
        x = self.dropout(x)
        return self.project(x) if self.project is not None else x
