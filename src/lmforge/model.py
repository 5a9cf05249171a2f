"""The model: token table -> embeddings -> block stack(s) -> hidden states.

Three thin wrappers over one `Stack`: `Encoder` (bidirectional, BERT), `Decoder`
(causal, GPT) and `EncoderDecoder` (T5/BART, the decoder cross-attends to the
encoder), and `XLNetEncoder` for XLNet's two-stream inputs. The model returns hidden
states and caches; task heads (heads.py) are attached by name and their outputs
returned alongside. Every layer runs the plain way (padded batch, dense SDPA);
`lmforge.optimize(model)` gives the model a faster execution with the same results
within float rounding (layers/execution.py), which `_context` and `_packing` consult.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from lmforge.config import ConfigError, ModelConfig
from lmforge.config.memory import check_fits
from lmforge.elmo import ELMo
from lmforge.layers.attention import AttentionContext, KVCache
from lmforge.layers.embeddings import Embeddings
from lmforge.layers.execution import PLAIN
from lmforge.layers.inputs import check_inputs, refuse_inputs
from lmforge.layers.inspection import Inspection
from lmforge.layers.norms import RMSNorm
from lmforge.layers.patterns import cross_bias
from lmforge.layers.positions import default_positions
from lmforge.layers.stack import Stack
from lmforge.layers.variants.two_stream import TwoStream

# heads that read one pooled vector per sequence: they never see padded rows, so unpadding may run
SEQUENCE_HEADS = ("pooler", "classification")


@dataclass
class ModelOutput:
    """What a forward pass returns; fields a pass does not compute stay None."""

    last_hidden_state: torch.Tensor  # (B, T, d_model); the decoder's for an encoder-decoder
    hidden_states: Optional[list] = None  # embeddings output + every layer's output
    # per layer (B, H, Tq, Tk) with return_attention=True; with a list of layers, None at the others
    attentions: Optional[list] = None
    cross_attentions: Optional[list] = None
    cache: Optional[KVCache] = None
    encoder_last_hidden_state: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None  # the first attached head's output
    head_outputs: dict = field(default_factory=dict)  # every attached head's output, by name
    mems: Optional[list] = None  # per layer (B, mem_len, d_model): XLNet's next memory (mem_len given)


@dataclass
class StackPass:
    """What one pass through a block stack is asked (Transformer._run): its inputs, the encoder
    output a decoder cross-attends to, and what to return besides the last hidden state."""

    input_ids: Optional[torch.Tensor] = None  # (B, T) new tokens
    attention_mask: Optional[torch.Tensor] = None  # (B, cached + T), 1 at real tokens
    position_ids: Optional[torch.Tensor] = None  # (B|1, T); default: past .. past + T - 1
    segment_ids: Optional[torch.Tensor] = None
    cache: Optional[KVCache] = None  # earlier positions' keys and values (decoding)
    global_tokens: Optional[torch.Tensor] = None  # (B, T) Longformer's global positions
    prefix_lengths: Optional[torch.Tensor] = None  # (B,) a prefix LM's bidirectional prefixes
    memory: Optional[torch.Tensor] = None  # (B, Tsrc, d_model) the encoder's output
    memory_mask: Optional[torch.Tensor] = None  # (B, Tsrc) its padding
    return_attention: object = False  # True, or the layers whose maps to return
    return_hidden: bool = False
    keep_padding: bool = False  # a per-token head reads the padded rows: no unpadding
    reads_first: bool = False  # a pooled head reads position 0 (a left-padded row's is padding)


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


# lmforge.io puts its save function here on import: the model never imports io, which builds models
_SAVERS: list = []


def register_saver(save) -> None:
    """Let `Transformer.save` call `save(model, path, format)` (lmforge.io registers itself)."""
    _SAVERS.append(save)


class Transformer(nn.Module):
    """Shared parts of the three architectures: config, token table, heads, checks, init."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.embed_dim)
        self.heads = nn.ModuleDict()
        # how the forward runs (layers/execution.py): plain until lmforge.optimize gives it a faster
        # one with the same results; not a module, not saved
        self.execution = PLAIN
        self.inspection = None  # an analysis's head gates and attention records (layers/inspection.py)

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

    def _embed(self, embed: Embeddings, input_ids, position_ids, segment_ids, past: int, mask=None):
        if position_ids is None:
            position_ids = default_positions(self.config, input_ids, mask, past)
        return embed(self.tokens(input_ids), position_ids, segment_ids), position_ids

    def _run(self, stack: Stack, embed: Embeddings, step: StackPass) -> ModelOutput:
        """One pass of `step`'s tokens through embeddings and stack, packed where the execution says."""
        past, mask = (step.cache.length if step.cache is not None else 0), step.attention_mask
        check_inputs(self.config, step.input_ids, mask, past, "input_ids", step.position_ids,
                     step.global_tokens)
        x, step.position_ids = self._embed(embed, step.input_ids, step.position_ids, step.segment_ids, past,
                                           mask)
        key_padding = mask.bool() if mask is not None else None
        keep_padding = step.keep_padding or self._recording(step)  # recorded maps hold padded query rows
        packing = self._packing(key_padding, step.cache, step.memory, keep_padding, step.reads_first)
        ctx = self._context(stack, x, step.position_ids, past, key_padding, step, packing=packing)
        if packing is not None:
            x = packing.pack(x)  # (N, d_model): real tokens only
        if step.memory is not None:
            ctx.memory = step.memory
            if step.memory_mask is not None:
                ctx.cross_bias = cross_bias(step.memory_mask, x.dtype)
        x, hidden, probs = stack(x, ctx, step.return_hidden)
        if packing is not None:
            x, hidden = packing.unpack(x), hidden and [packing.unpack(h) for h in hidden]
        return self._output(x, hidden, probs, step.return_attention, step.cache,
                            cross=step.memory is not None)

    def _context(self, stack: Stack, x, position_ids, past: int, key_padding, step: StackPass | None = None,
                 *, packing=None, dense=False) -> AttentionContext:
        """The stack's masks for this pass (`step`'s global tokens, cache, prefixes; None: none of them)
        and the attention backend of each, which the model's execution chooses (plain: dense SDPA).
        Recorded probabilities, prefixes and cached decoding need the dense masks; dense: the caller
        edits them."""
        step = step or StackPass()
        recording = self._recording(step)
        dense = dense or recording or step.prefix_lengths is not None or past > 0
        chosen = {} if dense else self.execution.local_layers(stack, x.shape[1])
        ctx = stack.context(x, position_ids, past, key_padding, step.global_tokens, step.cache,
                            step.prefix_lengths, skip=chosen)
        self.execution.choose_kernels(self, stack, ctx, chosen, packing, recording, x)
        if recording or self.inspection is not None:
            inspection = self.inspection or Inspection()
            ctx.inspection = inspection.for_stack("decoder" if stack.causal else "encoder",
                                                  step.return_attention)
        return ctx

    @staticmethod
    def _output(x, hidden, probs: list, return_attention: bool, cache=None,
                cross: bool = False) -> ModelOutput:
        return ModelOutput(x, hidden, [p[0] for p in probs] if return_attention else None,
                           [p[1] for p in probs] if return_attention and cross else None, cache)

    def _packing(self, key_padding, cache, memory, keep_padding=False, reads_first=False):
        """The batch's real tokens packed for the position-wise layers, where the execution does so
        (plain: never); keep_padding: a per-token head will read the padded rows; reads_first: a
        pooled head will read position 0."""
        return self.execution.packing(self, key_padding, cache, memory, keep_padding, reads_first)

    def _recording(self, step: StackPass) -> bool:
        """Whether this pass records attention maps (return_attention, or an inspection's records)."""
        return bool(step.return_attention) or (self.inspection is not None and bool(self.inspection.record))

    def _heads_read(self, run_heads: bool) -> dict:
        """StackPass's keep_padding (a head on this pass reads every position: LM, tagging, spans) and
        reads_first (a pooled head reads position 0, padding in a left-padded row)."""
        specs = [getattr(head, "spec", {}) for head in self.heads.values()] if run_heads else []
        return {"keep_padding": any(spec.get("kind") not in SEQUENCE_HEADS for spec in specs),
                "reads_first": any(spec.get("pooling") == "first" for spec in specs)}

    def save(self, path, format: str = "lmforge", labels: list[str] | None = None) -> None:
        """Write the directory `path`: lmforge's format, or format="hf" for the reference library, its
        classifier's outputs named by `labels` where given (lmforge.save's, checked there)."""
        if not _SAVERS:
            raise RuntimeError("saving needs lmforge.io (import lmforge)")
        _SAVERS[-1](self, path, format, labels=labels)

    def num_parameters(self, embeddings: bool = True) -> int:
        """Parameters of the backbone (heads excluded); without the token and position tables."""
        total = sum(p.numel() for n, p in self.named_parameters() if not n.startswith("heads."))
        if not embeddings:
            total -= sum(p.numel() for n, p in self.named_parameters()
                         if n == "tokens.weight" or n.endswith("positions.weight"))
        return total

    def reset_parameters(self, std: float = 0.02) -> None:
        """BERT/GPT initialisation of the backbone and its heads (see `init_weights`); a token table
        read through T5's d_model^-0.5 logit scale starts at N(0, 1) as in T5 (else logits start ~0)."""
        init_weights(self, std)
        if self.config.tie_embeddings and self.config.tied_logit_scale:
            nn.init.normal_(self.tokens.weight, std=1.0)


class Encoder(Transformer):
    """Bidirectional encoder (BERT, RoBERTa, ALBERT, ELECTRA, Longformer, BigBird; XLNet's is
    XLNetEncoder)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.embed = Embeddings(cfg)
        self.encoder = Stack(cfg, cfg.n_layers, causal=False, cross=False)
        self.register_forward_pre_hook(refuse_inputs, with_kwargs=True)

    def forward(self, input_ids, attention_mask=None, segment_ids=None, position_ids=None,
                global_tokens=None, return_attention=False, return_hidden=False,
                run_heads=True) -> ModelOutput:
        """input_ids (B, T) -> ModelOutput; global_tokens (B, T) bool for Longformer; run_heads=False
        returns hidden states only."""
        out = self._run(self.encoder, self.embed, StackPass(
            input_ids, attention_mask, position_ids, segment_ids, global_tokens=global_tokens,
            return_attention=return_attention, return_hidden=return_hidden,
            **self._heads_read(run_heads)))
        return self._with_heads(out, attention_mask, run_heads)


class XLNetEncoder(Encoder):
    """XLNet (Yang et al. 2019): an encoder with relative attention whose forward also takes the
    inputs of two-stream attention and Transformer-XL's memory (layers/variants/two_stream.py)."""

    def forward(self, input_ids, attention_mask=None, segment_ids=None, return_attention=False,
                return_hidden=False, run_heads=True, perm_mask=None, target_mapping=None, mems=None,
                mem_len=None) -> ModelOutput:
        """As Encoder.forward, with the reference XLNetModel's inputs: no position_ids (its positions are
        relative, counted from the memory) and no global_tokens (it has no global attention).
        segment_ids feed the relative segment term. perm_mask (B, T, T) 1 where i may not see j;
        target_mapping (B, n, T) gives the query stream's n rows (then last_hidden_state is theirs); mems
        from an earlier output (attention_mask then covers memory + new positions); mem_len returns
        out.mems."""
        streams = TwoStream(input_ids, self.config.n_layers, perm_mask, target_mapping, mems, mem_len)
        past = streams.past
        check_inputs(self.config, input_ids, attention_mask, past, "input_ids")
        x, position_ids = self._embed(self.embed, input_ids, None, segment_ids, past)
        key_padding = attention_mask.bool() if attention_mask is not None else None
        ctx = self._context(self.encoder, x, position_ids, past, key_padding,  # two streams edit dense masks
                            StackPass(return_attention=return_attention), dense=True)
        ctx = streams.prepare(ctx, self.encoder, segment_ids, x.dtype)
        x, hidden, probs = self.encoder(x, ctx, keep_hidden=True)  # the query stream reads layer inputs
        x, new_mems = streams.run(self.encoder, self.embed.query_init, self.embed.dropout, x, hidden, ctx)
        out = self._output(x, hidden if return_hidden else None, probs, return_attention)
        out.mems = new_mems
        return self._with_heads(out, attention_mask, run_heads)


class Decoder(Transformer):
    """Causal decoder (GPT, GPT-2, Llama-style); incremental decoding through a KVCache."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.embed = Embeddings(cfg)
        self.decoder = Stack(cfg, cfg.n_layers, causal=True, cross=False)

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                return_attention=False, return_hidden=False, run_heads=True,
                prefix_lengths=None) -> ModelOutput:
        """input_ids (B, T) new tokens; attention_mask covers cached + new positions; prefix_lengths
        (B,) makes the first P_b positions a bidirectional prefix (a prefix LM)."""
        if use_cache and cache is None:
            cache = KVCache()
        out = self._run(self.decoder, self.embed, StackPass(
            input_ids, attention_mask, position_ids, cache=cache, prefix_lengths=prefix_lengths,
            return_attention=return_attention, return_hidden=return_hidden,
            **self._heads_read(run_heads)))
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
        return self._run(self.encoder, self.encoder_embed, StackPass(
            input_ids, attention_mask, return_attention=return_attention, return_hidden=return_hidden))

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
        out = self._run(self.decoder, self.decoder_embed, StackPass(
            decoder_input_ids, decoder_attention_mask, cache=cache, memory=encoder_output.last_hidden_state,
            memory_mask=attention_mask, return_attention=return_attention, return_hidden=return_hidden))
        out.encoder_last_hidden_state = encoder_output.last_hidden_state
        return self._with_heads(out, decoder_attention_mask, run_heads)


# ELMo is a biLSTM, not a Transformer: its own class (lmforge/elmo.py) with the same save/head interface
ARCHITECTURES = {"encoder": Encoder, "decoder": Decoder, "encoder-decoder": EncoderDecoder, "elmo": ELMo}


def model_class(cfg: ModelConfig) -> type:
    """The class of `cfg`'s model: its architecture's, or XLNetEncoder for XLNet's relative attention."""
    return XLNetEncoder if cfg.position == "xl-relative" else ARCHITECTURES[cfg.architecture]


def from_config(cfg: ModelConfig, init: bool = True) -> Transformer:
    """The model that `cfg` describes, randomly initialised unless init=False; a config whose weights
    cannot fit in the machine's memory is refused before anything is allocated (config/memory.py);
    on the meta device (shapes only, nothing allocated) any config builds."""
    if not isinstance(cfg, ModelConfig):  # a preset name or a dict failed as "has no attribute"
        raise ConfigError(f"cfg must be a ModelConfig (lmforge.get_config, ModelConfig.from_dict), got "
                          f"{type(cfg).__name__}", "cfg")
    if torch.get_default_device().type != "meta":
        check_fits(cfg)
    model = model_class(cfg)(cfg)
    if init:
        model.reset_parameters()
    return model
