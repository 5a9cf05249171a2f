"""XLNet's two-stream self-attention and Transformer-XL's segment-recurrence memory.

Yang et al. 2019, sec. 2.3, eq. (4)-(5): two representations run through the same
layers with the same weights,

    content stream  h_{z_t}^(m) = Attention(Q = h_{z_t}^(m-1), KV = h_{z<=t}^(m-1))   (sees itself)
    query stream    g_{z_t}^(m) = Attention(Q = g_{z_t}^(m-1), KV = h_{z<t}^(m-1))    (never itself)

g^(0) = w (one trainable vector, `Embeddings.query_init`): the query stream knows the
position it predicts but not the token there. The order z is given as `perm_mask`
(B, T, T), 1 where i may NOT attend to j; the content stream additionally sees its own
position. `target_mapping` (B, n, T) places the n query rows (the predicted tokens,
sec. 2.3 "partial prediction") at their positions: queries are mapped onto positions,
attend with the relative terms of those positions, and are mapped back, as the
reference implementation does (a zero row is a padded prediction).

Sec. 2.5 (Dai et al. 2019, sec. 3.2): `mems` holds, per layer, the previous segment's
layer inputs (B, M, d_model), detached; they are extra keys/values at positions
0..M-1, before the current segment's M..M+T-1 (`Memory`, read by attention's cache step).
A pass with `mem_len` returns the new memory: the last mem_len positions of [mems; this
segment's layer inputs].

Because the content stream never reads the query stream, the content pass runs first
over all layers (the ordinary stack, its layer inputs kept), then the query stream
over the same blocks against those inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from lmforge.layers.attention import Attention, AttentionContext, attend
from lmforge.layers.patterns import additive
from lmforge.layers.stack import Stack


@dataclass
class XLNetContext(AttentionContext):
    """An AttentionContext with XLNet's segment ids (B, M+T) for the relative attention's segment term."""

    segments: Optional[torch.Tensor] = None


class Memory:
    """Transformer-XL's memory in attention's cache step: each layer's keys and values of the previous
    segment's states (B, Hkv, M, dh) come before the current segment's; nothing is added to it."""

    def __init__(self, stack: Stack, mems: list) -> None:
        blocks = [stack.blocks[0 if stack.cfg.share_layers else i] for i in range(stack.n_layers)]
        self.kv = [block.attn.keys_values(m) for block, m in zip(blocks, mems)]

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """The memory's keys and values, then this segment's (B, Hkv, T, dh): (B, Hkv, M+T, dh)."""
        k_mem, v_mem = self.kv[layer]
        return torch.cat([k_mem, k], dim=2), torch.cat([v_mem, v], dim=2)


class TwoStream:
    """One forward pass's permutation mask, prediction targets and memory (all optional)."""

    def __init__(self, input_ids: torch.Tensor, n_layers: int, perm_mask=None, target_mapping=None,
                 mems: list | None = None, mem_len: int | None = None) -> None:
        B, T = input_ids.shape
        if perm_mask is not None and tuple(perm_mask.shape) != (B, T, T):
            raise ValueError(f"perm_mask must have shape (batch, length, length) = {(B, T, T)}, "
                             f"got {tuple(perm_mask.shape)}")
        if target_mapping is not None and (target_mapping.dim() != 3 or target_mapping.shape[0] != B
                                           or target_mapping.shape[2] != T):
            raise ValueError(f"target_mapping must have shape (batch, n_predict, length) = ({B}, n, {T}), "
                             f"got {tuple(target_mapping.shape)}")
        if mems is not None and (len(mems) != n_layers or any(
                m.dim() != 3 or m.shape[0] != B or m.shape[1:] != mems[0].shape[1:] for m in mems)):
            raise ValueError(f"mems must be {n_layers} tensors of shape (batch, memory length, d_model)")
        if mem_len is not None and (isinstance(mem_len, bool) or not isinstance(mem_len, int) or mem_len < 1):
            raise ValueError(f"mem_len must be a positive number of positions, got {mem_len}")
        self.perm_mask, self.target_mapping = perm_mask, target_mapping
        self.mems, self.mem_len = mems, mem_len
        self.query_biases: dict = {}

    @property
    def past(self) -> int:
        """Memory length M: the current segment's positions start after it."""
        return self.mems[0].shape[1] if self.mems is not None else 0

    def prepare(self, ctx: AttentionContext, stack: Stack, segments, dtype: torch.dtype) -> XLNetContext:
        """The content stream's context: memory and segments, masks restricted to the order; and the
        query stream's masks. segments (B, T) or None."""
        M = self.past
        ctx = XLNetContext(**vars(ctx), segments=segments)
        if self.mems is not None:
            if self.mems[0].shape[2] != stack.cfg.d_model:
                raise ValueError(f"mems must have d_model={stack.cfg.d_model} features, "
                                 f"got {self.mems[0].shape[2]}")
            ctx.cache = Memory(stack, self.mems)
            if segments is not None:  # the memory counts as segment 0 (the reference's choice)
                ctx.segments = torch.cat([segments.new_zeros(segments.shape[0], M), segments], 1)
        if self.perm_mask is not None or self.target_mapping is not None or ctx.key_padding is not None:
            self._masks(ctx, dtype)
        return ctx

    def _masks(self, ctx: XLNetContext, dtype: torch.dtype) -> None:
        # the content stream sees the order's earlier positions and itself; the query stream not itself
        visible, reopened = self._visible(ctx)
        # (T, M+T): each position's own content, a padded position's too (the reference's
        # non_tgt_mask; a padded row's state is the next memory, and a target that sees nothing
        # averages every row)
        own = ctx.q_pos[:, None] == ctx.k_pos[None, :]
        for key, bias in ctx.biases.items():
            query = additive(visible[:, None], bias, dtype)
            content = query if self.perm_mask is not None else bias
            if content is not None:
                ctx.biases[key] = _opened(content, own if reopened is None else own | reopened[:, None])
            self.query_biases[key] = query if reopened is None else _opened(query, reopened[:, None])

    def _visible(self, ctx: XLNetContext) -> tuple:
        """(B|1, T|1, M+T) the keys each position may see, and the padded ones among them (or None):
        the reference thresholds padding + perm_mask, so a NaN or <= -1 entry reopens a padded key."""
        M, T = self.past, ctx.q_pos.shape[0]
        padding = ctx.key_padding
        visible = padding[:, None, :] if padding is not None else torch.ones(
            1, 1, M + T, dtype=torch.bool, device=ctx.q_pos.device)
        if self.perm_mask is None:
            return visible, None
        perm = self.perm_mask.float()
        memory = torch.zeros(*perm.shape[:2], M, dtype=torch.bool, device=perm.device)  # earlier than all
        visible = visible & ~torch.cat([memory, perm > 0], dim=-1)
        if padding is None:
            return visible, None
        reopened = torch.cat([memory, ~(perm + 1 > 0)], dim=-1) & ~padding[:, None, :]
        return visible | reopened, reopened

    def run(self, stack: Stack, query_init: torch.Tensor, dropout, x, hidden: list, ctx) -> tuple:
        """After the content pass: (the query stream's output or x, the new memory or None)."""
        new_mems = None
        if self.mem_len is not None:
            inputs = hidden[:stack.n_layers]  # layer inputs, (B, T, d) each
            if self.mems is not None:
                inputs = [torch.cat([m, h], dim=1) for m, h in zip(self.mems, inputs)]
            new_mems = [h[:, -self.mem_len:].detach() for h in inputs]  # stop-gradient (sec. 2.5)
        if self.target_mapping is None:
            return x, new_mems
        B, n = self.target_mapping.shape[:2]
        g = dropout(query_init.expand(B, n, -1))  # g^(0) = w at every predicted position
        return self.query_stream(stack, g, hidden, ctx), new_mems

    def query_stream(self, stack: Stack, g: torch.Tensor, hidden: list, ctx) -> torch.Tensor:
        """g (B, n, d) through every layer, attending to that layer's content-stream input."""
        for layer in range(stack.n_layers):
            block = stack.blocks[0 if stack.cfg.share_layers else layer]
            key = stack.mask_keys[layer]
            content = hidden[layer] if self.mems is None else torch.cat([self.mems[layer], hidden[layer]], 1)

            def attention(q_in, block=block, content=content, key=key, layer=layer):
                return query_attention(block.attn, q_in, content, ctx, self.query_biases[key],
                                       self.target_mapping, layer), None
            g, _ = block(g, ctx, layer, key, self_attention=attention)
        return stack.final_norm(g) if stack.final_norm is not None else g


def query_attention(attn: Attention, g: torch.Tensor, content: torch.Tensor, ctx: AttentionContext,
                    bias: torch.Tensor, target_mapping: torch.Tensor, layer: int) -> torch.Tensor:
    """Query stream of one layer: queries from g (B, n, d) at their positions, keys and values
    from the content stream (B, M+T, d); returns (B, n, d_model). Head gates are the content
    stream's: a head is one set of weights, whichever stream it reads."""
    H, dh = attn.n_heads, attn.dh
    q = attn.qkv(g)[..., :H * dh]  # (B, n, H*dh); the same W_q as the content stream
    q = torch.einsum("bnt,bnc->btc", target_mapping.to(q.dtype), q)  # onto positions: (B, T, H*dh)
    B, T, _ = q.shape
    q = q.view(B, T, H, dh).transpose(1, 2)  # (B, H, T, dh)
    k, v = attn.keys_values(content)  # (B, Hkv, M+T, dh)
    q, k, bias = attn.positions(q, k, ctx, bias)  # XL's relative terms, as in the content stream
    out, _ = attend(q, k, v, bias, attn.dropout_p if attn.training else 0.0, attn.scale)
    out = out.transpose(1, 2).reshape(B, T, H * dh)
    out = torch.einsum("bnt,btc->bnc", target_mapping.to(out.dtype), out)  # back to the n queries
    return attn.out(attn.gated(out, ctx, "self", layer))


def _opened(bias: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`bias` with `keys` visible where it hides them (padding): XLNet has no additive position bias,
    so a visible entry's value is 0."""
    return torch.where(keys & (bias == torch.finfo(bias.dtype).min), 0.0, bias).to(bias.dtype)
