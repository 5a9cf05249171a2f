"""The model: token table -> embeddings -> block stack(s) -> hidden states.

Three thin wrappers over one `Stack`: `Encoder` (bidirectional, BERT), `Decoder`
(causal, GPT) and `EncoderDecoder` (T5/BART, the decoder cross-attends to the
encoder). The model returns hidden states and caches; task heads (heads.py) are
attached by name and their outputs returned alongside.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.layers.attention import KVCache
from lmforge.layers.embeddings import Embeddings
from lmforge.layers.norms import RMSNorm
from lmforge.layers.stack import Stack, additive


@dataclass
class ModelOutput:
    """What a forward pass returns; fields a pass does not compute stay None."""

    last_hidden_state: torch.Tensor  # (B, T, d_model); the decoder's for an encoder-decoder
    hidden_states: Optional[list] = None  # embeddings output + every layer's output
    attentions: Optional[list] = None  # per layer (B, H, Tq, Tk) with return_attention=True
    cross_attentions: Optional[list] = None
    cache: Optional[KVCache] = None
    encoder_last_hidden_state: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None  # the first attached head's output
    head_outputs: dict = field(default_factory=dict)  # every attached head's output, by name


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """N(0, std) weights and tables (Devlin et al. 2019), zero biases, unit norm gains."""
    for name, p in module.named_parameters():
        if name.rsplit(".", 1)[-1] == "bias":
            nn.init.zeros_(p)
        else:
            nn.init.normal_(p, std=std)
    for sub in module.modules():
        if isinstance(sub, (nn.LayerNorm, RMSNorm)):
            nn.init.ones_(sub.weight)


class Transformer(nn.Module):
    """Shared parts of the three architectures: config, token table, heads, checks, init."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.embed_dim)
        self.heads = nn.ModuleDict()

    def add_head(self, name: str, head: nn.Module) -> nn.Module:
        """Attach a task head (heads.py); its output appears in ModelOutput.head_outputs[name]."""
        self.heads[name] = head.train(self.training)  # a head added to an eval model is in eval too
        return head

    def _with_heads(self, out: ModelOutput, attention_mask, run_heads: bool = True) -> ModelOutput:
        # run_heads=False: objectives and generation apply heads to the positions they need only
        if not run_heads:
            return out
        for name, head in self.heads.items():
            out.head_outputs[name] = head(out.last_hidden_state, attention_mask)
        if out.head_outputs:
            out.logits = next(iter(out.head_outputs.values()))
        return out

    def _check(self, input_ids: torch.Tensor, attention_mask, past: int, name: str) -> None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"{name} must be an integer tensor of shape (batch, length), got {shape}")
        B, T = input_ids.shape
        if T == 0:
            raise ValueError(f"{name} is empty: a sequence needs at least one token")
        if past + T > self.config.max_seq_len:
            raise ValueError(f"{name}: {past + T} positions exceed max_seq_len={self.config.max_seq_len}")
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(f"{name} holds token id {low if low < 0 else high} outside the "
                             f"vocabulary [0, {self.config.vocab_size})")
        if attention_mask is not None and tuple(attention_mask.shape) != (B, past + T):
            raise ValueError(f"attention mask of shape {tuple(attention_mask.shape)} does not match "
                             f"(batch, cached + new positions) = {(B, past + T)}")

    def _embed(self, embed: Embeddings, input_ids, position_ids, segment_ids, past: int):
        if position_ids is None:
            position_ids = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)[None]
        return embed(self.tokens(input_ids), position_ids, segment_ids), position_ids

    def _run(self, stack: Stack, embed: Embeddings, input_ids, attention_mask, *, position_ids=None,
             segment_ids=None, cache=None, global_tokens=None, return_attention=False,
             return_hidden=False, memory=None, memory_mask=None) -> ModelOutput:
        past = cache.length if cache is not None else 0
        self._check(input_ids, attention_mask, past, "input_ids")
        x, position_ids = self._embed(embed, input_ids, position_ids, segment_ids, past)
        key_padding = attention_mask.bool() if attention_mask is not None else None
        ctx = stack.context(x, position_ids, past, key_padding, global_tokens, segment_ids,
                            cache, return_attention)
        if memory is not None:
            ctx.memory = memory
            if memory_mask is not None:
                ctx.cross_bias = additive(memory_mask.bool()[:, None, None, :], None, x.dtype)
        x, hidden, probs = stack(x, ctx, return_hidden)
        return ModelOutput(x, hidden, [p[0] for p in probs] if return_attention else None,
                           [p[1] for p in probs] if return_attention and memory is not None else None,
                           cache)

    def save(self, path, format: str = "lmforge") -> None:
        """Write the directory `path`: lmforge's format, or format="hf" for the reference library."""
        from lmforge.io import save  # io and convert build heads, which import this module

        save(self, path, format)

    def num_parameters(self, embeddings: bool = True) -> int:
        """Parameters of the backbone (heads excluded); without the token and position tables."""
        total = sum(p.numel() for n, p in self.named_parameters() if not n.startswith("heads."))
        if not embeddings:
            total -= sum(p.numel() for n, p in self.named_parameters()
                         if n == "tokens.weight" or n.endswith("positions.weight"))
        return total

    def reset_parameters(self, std: float = 0.02) -> None:
        """BERT/GPT initialisation of the backbone and its heads (see `init_weights`)."""
        init_weights(self, std)


class Encoder(Transformer):
    """Bidirectional encoder (BERT, RoBERTa, ALBERT, ELECTRA, XLNet, Longformer, BigBird)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.embed = Embeddings(cfg)
        self.encoder = Stack(cfg, cfg.n_layers, causal=False, cross=False)

    def forward(self, input_ids, attention_mask=None, segment_ids=None, position_ids=None,
                global_tokens=None, return_attention=False, return_hidden=False, run_heads=True) -> ModelOutput:
        """input_ids (B, T) -> ModelOutput; global_tokens (B, T) bool for Longformer; run_heads=False
        returns hidden states only."""
        out = self._run(self.encoder, self.embed, input_ids, attention_mask, position_ids=position_ids,
                        segment_ids=segment_ids, global_tokens=global_tokens,
                        return_attention=return_attention, return_hidden=return_hidden)
        return self._with_heads(out, attention_mask, run_heads)


class Decoder(Transformer):
    """Causal decoder (GPT, GPT-2, Llama-style); incremental decoding through a KVCache."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.embed = Embeddings(cfg)
        self.decoder = Stack(cfg, cfg.n_layers, causal=True, cross=False)

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                return_attention=False, return_hidden=False, run_heads=True) -> ModelOutput:
        """input_ids (B, T) new tokens; attention_mask covers cached + new positions."""
        if use_cache and cache is None:
            cache = KVCache()
        out = self._run(self.decoder, self.embed, input_ids, attention_mask, position_ids=position_ids,
                        cache=cache, return_attention=return_attention, return_hidden=return_hidden)
        return self._with_heads(out, attention_mask, run_heads)


class EncoderDecoder(Transformer):
    """Encoder-decoder (T5, BART): the decoder cross-attends to the encoder's output."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.encoder_embed = Embeddings(cfg)
        self.encoder = Stack(cfg, cfg.n_layers, causal=False, cross=False)
        self.decoder_embed = Embeddings(cfg)
        self.decoder = Stack(cfg, cfg.decoder_layers, causal=True, cross=True)

    def encode(self, input_ids, attention_mask=None, return_attention=False,
               return_hidden=False) -> ModelOutput:
        """Run the encoder alone (once per generation)."""
        return self._run(self.encoder, self.encoder_embed, input_ids, attention_mask,
                         return_attention=return_attention, return_hidden=return_hidden)

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None,
                decoder_attention_mask=None, encoder_output=None, cache=None, use_cache=False,
                return_attention=False, return_hidden=False, run_heads=True) -> ModelOutput:
        """Encode input_ids (unless encoder_output is given) and decode decoder_input_ids."""
        if decoder_input_ids is None:
            raise ValueError("an encoder-decoder needs decoder_input_ids")
        if encoder_output is None:
            encoder_output = self.encode(input_ids, attention_mask, return_attention, return_hidden)
        if use_cache and cache is None:
            cache = KVCache()
        out = self._run(self.decoder, self.decoder_embed, decoder_input_ids, decoder_attention_mask,
                        cache=cache, return_attention=return_attention, return_hidden=return_hidden,
                        memory=encoder_output.last_hidden_state, memory_mask=attention_mask)
        out.encoder_last_hidden_state = encoder_output.last_hidden_state
        return self._with_heads(out, decoder_attention_mask, run_heads)


ARCHITECTURES = {"encoder": Encoder, "decoder": Decoder, "encoder-decoder": EncoderDecoder}


def from_config(cfg: ModelConfig, init: bool = True) -> Transformer:
    """The model that `cfg.architecture` names, randomly initialised unless init=False."""
    model = ARCHITECTURES[cfg.architecture](cfg)
    if init:
        model.reset_parameters()
    return model
