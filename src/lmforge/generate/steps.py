"""A model's forward passes during generation: the prompt once, then each row's new token."""
from __future__ import annotations

from typing import Optional

import torch

from lmforge.config.options import OptionsError
from lmforge.generate.vocab.projection import VocabProjection
from lmforge.layers.attention import KVCache
from lmforge.model import ModelOutput, Transformer


def lm_head_name(model: Transformer) -> str:
    """The name of the model's language-modelling head; an error if it has none."""
    for name, head in model.heads.items():
        if head.spec["kind"] == "lm":
            return name
    raise OptionsError("generation needs a language-modelling head: load a *LMHeadModel / "
                       "*ForCausalLM / *ForConditionalGeneration checkpoint or attach(model, 'lm')", "model")


class DecoderSteps:
    """A decoder's forward passes: the prompt once, then the new token of each row (the whole
    sequence again without a cache). Rows are left-padded; positions count real tokens only."""

    def __init__(self, model, lm, input_ids, mask, use_cache: bool = True, prefix_lm: bool = False,
                 projection: Optional[VocabProjection] = None) -> None:
        """projection: how the LM head's vocabulary projection is computed (default: plainly)."""
        self.model, self.lm = model, lm
        self.projection = projection or VocabProjection(lm, "plain")
        self.tokens, self.mask = input_ids, mask  # (N, T)
        self.positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.cache = KVCache() if use_cache else None
        # a prefix LM reads the whole prompt bidirectionally: keys before T are the prefix
        N, T = input_ids.shape
        self.prefix = torch.full((N,), T, device=input_ids.device) if prefix_lm else None

    def logits(self) -> torch.Tensor:
        """(N, V) next-token logits after the tokens so far."""
        return self.projection.logits(self.lm.features(self.hidden()))  # of one position only

    def hidden(self) -> torch.Tensor:
        """(N, d_model) final hidden state of the last position, after the tokens so far."""
        fed = self.cache.length if self.cache is not None else 0
        extra = {} if self.prefix is None else {"prefix_lengths": self.prefix}
        hidden = self.model(self.tokens[:, fed:], self.mask, position_ids=self.positions[:, fed:],
                            cache=self.cache, run_heads=False, **extra).last_hidden_state
        return hidden[:, -1]

    def append(self, chosen: torch.Tensor) -> None:
        """Add (N,) tokens after every row."""
        self.tokens = torch.cat([self.tokens, chosen[:, None]], dim=1)
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        self.positions = torch.cat([self.positions, self.positions[:, -1:] + 1], dim=1)

    def reorder(self, rows: torch.Tensor) -> None:
        """Continue the rows `rows` (N,) of the same input (beam search)."""
        self.tokens, self.mask, self.positions = (t.index_select(0, rows)
                                                  for t in (self.tokens, self.mask, self.positions))
        if self.cache is not None:
            self.cache.reorder(rows)
        if self.prefix is not None:
            self.prefix = self.prefix.index_select(0, rows)


class EncoderDecoderSteps(DecoderSteps):
    """An encoder-decoder's decoder passes; the encoder runs once, its output shared by `copies`
    rows per input (beams), and its cross-attention keys and values are cached on the first step."""

    def __init__(self, model, lm, input_ids, mask, start: int, copies: int = 1,
                 use_cache: bool = True, projection: Optional[VocabProjection] = None) -> None:
        encoded = model.encode(input_ids, mask).last_hidden_state  # (B, S, d_model)
        self.memory = ModelOutput(encoded.repeat_interleave(copies, 0))
        self.memory_mask = mask.repeat_interleave(copies, 0)
        N = self.memory_mask.shape[0]
        tokens = torch.full((N, 1), start, dtype=torch.long, device=input_ids.device)
        super().__init__(model, lm, tokens, torch.ones_like(tokens), use_cache, projection=projection)

    def hidden(self) -> torch.Tensor:
        """(N, d_model) the decoder's final hidden state of the last position."""
        fed = self.cache.length if self.cache is not None else 0
        hidden = self.model(attention_mask=self.memory_mask, decoder_input_ids=self.tokens[:, fed:],
                            encoder_output=self.memory, cache=self.cache, run_heads=False).last_hidden_state
        return hidden[:, -1]
