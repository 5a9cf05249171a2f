"""Text generation for decoders and encoder-decoders with a KV cache.

Greedy decoding, temperature sampling, top-k (Fan et al. 2018), nucleus / top-p
(Holtzman et al. 2020), beam search (beam.py) and the logit processors of processors.py
(repetition penalty, n-gram blocking, minimum length, forced first/last tokens); stop
tokens, a budget of new tokens and left-padded batches. Decoders return prompt + new
tokens; encoder-decoders return the decoder's tokens, starting with the decoder start
token — the same shapes the reference library's `generate` returns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from lmforge.generate.beam import Beams, beam_search
from lmforge.generate.fast.lean import LeanDecoder, lean_decoding_supported
from lmforge.generate.fast.screen import GreedyScreen, greedy_screen
from lmforge.generate.processors import Constraints
from lmforge.heads import LMHead
from lmforge.layers.attention import KVCache
from lmforge.layers.fastpath import weight_layout
from lmforge.model import EncoderDecoder, ModelOutput, Transformer


@dataclass
class Sampling:
    """How the next token is chosen from the logits (greedy unless do_sample)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature} "
                             f"(use do_sample=False for greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


def filter_top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest scores of each row; the rest become -inf."""
    k = min(k, scores.shape[-1])
    kth = scores.topk(k, dim=-1).values[..., -1:]
    return scores.masked_fill(scores < kth, float("-inf"))


def filter_top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of highest-probability tokens whose mass reaches p (at least one)."""
    ordered, order = scores.sort(dim=-1, descending=True)
    mass_before = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1)  # mass of strictly better tokens
    drop = mass_before >= p
    drop[..., 0] = False
    return scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def argmax_rows(scores: torch.Tensor, block: int = 128) -> torch.Tensor:
    """(N, V) -> (N,) each row's argmax (its first maximum; NaN counts as the maximum, as in argmax).

    On CPU, argmax over a vocabulary runs ~7x slower than amax (50257 logits: ~100 vs 13 us a row,
    bench/FINDINGS.md), so the maximum is found among block maxima first, then inside its block.
    The last block is the row's final `block` scores: it overlaps the one before when V is not a
    multiple, and an overlapped maximum is found first in the earlier block, as argmax finds it."""
    N, V = scores.shape
    n = V // block
    if scores.device.type != "cpu" or n < 2 or scores.stride(-1) != 1:
        return scores.argmax(-1)
    maxima = torch.cat([scores[:, :n * block].view(N, n, block).amax(-1),
                        scores[:, V - block:].amax(-1, keepdim=True)], dim=1)  # (N, n + 1)
    # (N,) first score of the chosen block: the last block (best == n) starts at V - block
    start = (maxima.argmax(-1) * block).clamp_(max=V - block)
    window = start[:, None] + torch.arange(block, device=scores.device)
    return start + scores.gather(1, window).argmax(-1)


def next_tokens(scores: torch.Tensor, rule: Sampling,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """(B, V) processed next-position scores -> (B,) chosen token ids."""
    scores = scores.float()
    if not rule.do_sample:
        return argmax_rows(scores)
    scores = scores / rule.temperature
    if rule.top_k:
        scores = filter_top_k(scores, rule.top_k)
    if rule.top_p < 1.0:
        scores = filter_top_p(scores, rule.top_p)
    return torch.multinomial(scores.softmax(-1), 1, generator=generator).squeeze(-1)


def lm_head_name(model: Transformer) -> str:
    """The name of the model's language-modelling head; an error if it has none."""
    for name, head in model.heads.items():
        if head.spec["kind"] == "lm":
            return name
    raise ValueError("generation needs a language-modelling head: load a *LMHeadModel / "
                     "*ForCausalLM / *ForConditionalGeneration checkpoint or attach(model, 'lm')")


def _lean(model, use_cache: bool, memory_mask=None) -> Optional[LeanDecoder]:
    """The lean cached steps (decode_step.py) when the model's fast paths ask for them and it has them."""
    if use_cache and model.fast.lean_decoding and lean_decoding_supported(model):
        return LeanDecoder(model, memory_mask)
    return None


class DecoderSteps:
    """A decoder's forward passes: the prompt once, then the new token of each row (the whole
    sequence again without a cache). Rows are left-padded; positions count real tokens only."""

    def __init__(self, model, lm, input_ids, mask, use_cache: bool = True, prefix_lm: bool = False,
                 memory_mask=None) -> None:
        self.model, self.lm = model, lm
        self.tokens, self.mask = input_ids, mask  # (N, T)
        self.positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.cache = KVCache() if use_cache else None
        # a prefix LM reads the whole prompt bidirectionally: keys before T are the prefix
        N, T = input_ids.shape
        self.prefix = torch.full((N,), T, device=input_ids.device) if prefix_lm else None
        self.lean = _lean(model, use_cache, memory_mask)  # the steps after the first

    def logits(self) -> torch.Tensor:
        """(N, V) next-token logits after the tokens so far."""
        return self.lm(self.hidden())  # the vocabulary projection of one position only

    def hidden(self) -> torch.Tensor:
        """(N, d_model) final hidden state of the last position, after the tokens so far."""
        fed = self.cache.length if self.cache is not None else 0
        if fed and self.lean is not None:
            hidden = self.lean(self.tokens[:, fed:], self.mask, self.positions[:, fed:], self.cache, self.prefix)
        else:
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
                 use_cache: bool = True) -> None:
        encoded = model.encode(input_ids, mask).last_hidden_state  # (B, S, d_model)
        self.memory = ModelOutput(encoded.repeat_interleave(copies, 0))
        self.memory_mask = mask.repeat_interleave(copies, 0)
        N = self.memory_mask.shape[0]
        tokens = torch.full((N, 1), start, dtype=torch.long, device=input_ids.device)
        super().__init__(model, lm, tokens, torch.ones_like(tokens), use_cache, memory_mask=self.memory_mask)

    def hidden(self) -> torch.Tensor:
        """(N, d_model) the decoder's final hidden state of the last position."""
        fed = self.cache.length if self.cache is not None else 0
        if fed and self.lean is not None:  # the first step has cached the encoder's keys and values
            hidden = self.lean(self.tokens[:, fed:], None, None, self.cache)
        else:
            hidden = self.model(attention_mask=self.memory_mask, decoder_input_ids=self.tokens[:, fed:],
                                encoder_output=self.memory, cache=self.cache, run_heads=False).last_hidden_state
        return hidden[:, -1]


class _Finished:
    """Which rows have produced a stop token; later positions of those rows get `pad`."""

    def __init__(self, stop: Optional[torch.Tensor], pad: Optional[int], n: int, device) -> None:
        self.stop, self.pad = stop, pad
        self.done = torch.zeros(n, dtype=torch.bool, device=device)

    def mark(self, chosen: torch.Tensor) -> torch.Tensor:
        """(N,) chosen tokens with finished rows padded; the rows that stop now are noted."""
        if self.stop is None:
            return chosen
        chosen = torch.where(self.done, torch.full_like(chosen, self.pad), chosen)
        self.done |= torch.isin(chosen, self.stop)
        return chosen


def _screen(model, lm, rule: Sampling, constraints: Constraints, max_new_tokens: int) -> Optional[GreedyScreen]:
    """The screened argmax of greedy decoding (vocab_screen.py) where it applies, else None: not
    for a few steps, which would not repay the check that the weights are unchanged, not where a
    processor changes the scores at every step, and not under autocast (its logits are bf16)."""
    if (rule.do_sample or max_new_tokens < 4 or not isinstance(lm, LMHead) or constraints.always_active
            or torch.is_autocast_enabled("cpu")):
        return None
    return greedy_screen(lm, *lm.projection(), mode=model.fast.screened_greedy)


def _choose(steps, constraints, rule, generator, screen) -> torch.Tensor:
    """(N,) next tokens: through the screen when no processor changes this step's scores."""
    hidden = steps.hidden()
    if screen is not None and screen.active and constraints.inert(steps.tokens.shape[1]):
        features = steps.lm.features(hidden)
        chosen = screen(features)
        if chosen is not None:
            return chosen
        logits = steps.lm.project(features)
    else:
        logits = steps.lm(hidden)
    return next_tokens(constraints(logits, steps.tokens), rule, generator)


def _sample(steps, constraints, rule, finished, max_new_tokens, generator, streamer) -> torch.Tensor:
    """Greedy decoding or sampling, one token per row per step."""
    screen = _screen(steps.model, steps.lm, rule, constraints, max_new_tokens)
    for _ in range(max_new_tokens):
        chosen = finished.mark(_choose(steps, constraints, rule, generator, screen))
        steps.append(chosen)
        if streamer is not None:
            streamer(chosen)
        if bool(finished.done.all()):
            break
    return steps.tokens


@torch.no_grad()
def generate(model: Transformer, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, *,
             max_new_tokens: int = 20, do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, repetition_penalty: float = 1.0, num_beams: int = 1,
             length_penalty: float = 1.0, early_stopping: Union[bool, str] = False,
             num_return_sequences: int = 1, min_new_tokens: int = 0, min_length: int = 0,
             no_repeat_ngram_size: int = 0, forced_bos_token_id: Optional[int] = None,
             forced_eos_token_id: Optional[int] = None, suppress_tokens=None, eos_token_id=None,
             pad_token_id=None, decoder_start_token_id: Optional[int] = None, use_cache: bool = True,
             prefix_lm: bool = False, generator: Optional[torch.Generator] = None,
             streamer: Optional[Callable] = None) -> torch.Tensor:
    """Continue `input_ids` (B, T), left-padded when `attention_mask` has zeros.

    Decoders return (B * R, T + n) prompt and new tokens; encoder-decoders return (B * R, 1 + n)
    decoder tokens (R = num_return_sequences; with beams the R best of each input, best first).
    Arguments mean what the reference library's `generate` arguments of the same names mean;
    stop, pad, forced and decoder start ids default to the model config's. use_cache=False
    recomputes every position at every step (same tokens, slower); prefix_lm=True lets a decoder
    pretrained as a prefix LM read the prompt bidirectionally (objectives/prefix_lm.py); `streamer`
    receives each step's (B * R,) new tokens (greedy and sampling only)."""
    rule = Sampling(do_sample, temperature, top_k, top_p)
    if prefix_lm and isinstance(model, EncoderDecoder):
        raise ValueError("prefix_lm is for decoders: an encoder-decoder's encoder already reads the input "
                         "bidirectionally")
    beams = Beams(num_beams, length_penalty, early_stopping, num_return_sequences)
    head = lm_head_name(model)
    mask = _check_prompt(model, input_ids, attention_mask, max_new_tokens)
    ids = _special_ids(model, eos_token_id, pad_token_id, decoder_start_token_id, forced_bos_token_id,
                       forced_eos_token_id, suppress_tokens)
    _check_options(beams, rule, streamer, repetition_penalty, min_new_tokens, min_length,
                   no_repeat_ngram_size)
    copies = num_beams if num_beams > 1 else num_return_sequences
    was_training = model.training
    model.eval()
    if not was_training and model.fast.decode_layout and input_ids.device.type == "cpu":
        weight_layout(model, input_major=True)  # kept after the call: relaying out costs more than a step
    try:
        if isinstance(model, EncoderDecoder):
            steps = EncoderDecoderSteps(model, model.heads[head], input_ids, mask, ids["start"], copies,
                                        use_cache)
        else:
            steps = DecoderSteps(model, model.heads[head], input_ids.repeat_interleave(copies, 0),
                                 mask.repeat_interleave(copies, 0), use_cache, prefix_lm)
        prompt_len = steps.tokens.shape[1]
        padding = (steps.mask == 0).sum(1) if not isinstance(model, EncoderDecoder) else None
        constraints = Constraints(prompt_len, prompt_len + max_new_tokens, ids["eos"], repetition_penalty,
                                  padding, no_repeat_ngram_size, min_length, min_new_tokens, ids["bos"],
                                  ids["forced_eos"], ids["suppress"])
        if num_beams > 1:
            # the reference fills short hypotheses with pad, or eos where pad is unset or 0
            fill = ids["pad"] if ids["pad"] else int(ids["eos"][0]) if ids["eos"] is not None else -1
            return beam_search(steps, constraints, beams, ids["eos"], fill, max_new_tokens)
        finished = _Finished(ids["eos"], ids["pad"], steps.tokens.shape[0], input_ids.device)
        return _sample(steps, constraints, rule, finished, max_new_tokens, generator, streamer)
    finally:
        model.train(was_training)


def _check_prompt(model: Transformer, input_ids, attention_mask, max_new_tokens: int) -> torch.Tensor:
    """Refuse a request the model cannot serve, before any model call; returns the (B, T) mask."""
    if model.config.architecture == "encoder":
        raise ValueError("generation needs a decoder or an encoder-decoder; an encoder with an MLM head "
                         "fills masks instead (lmforge.apps.fill_mask)")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be an integer tensor of shape (batch, length), got {shape}")
    B, T = input_ids.shape
    if B == 0 or T == 0:
        raise ValueError("the prompt is empty: generation needs at least one token per row")
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
    if tuple(mask.shape) != (B, T):
        raise ValueError(f"attention_mask of shape {tuple(mask.shape)} does not match input_ids {(B, T)}")
    if not bool(mask.any(1).all()):
        row = int((~mask.any(1)).nonzero()[0])
        raise ValueError(f"row {row} of the prompt is empty (its attention mask is 0)")
    cfg = model.config
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= cfg.vocab_size:
        raise ValueError(f"the prompt holds token id {low if low < 0 else high} outside the vocabulary "
                         f"[0, {cfg.vocab_size})")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if T > cfg.max_seq_len:
        raise ValueError(f"the prompt of {T} tokens is longer than the context, "
                         f"max_seq_len={cfg.max_seq_len}")
    decoded = 1 if isinstance(model, EncoderDecoder) else T  # decoder positions before the new tokens
    if decoded + max_new_tokens - 1 > cfg.max_seq_len:  # the last new token is never fed back
        raise ValueError(f"{decoded} starting tokens plus max_new_tokens={max_new_tokens} exceed the "
                         f"context, max_seq_len={cfg.max_seq_len}")
    if not isinstance(model, EncoderDecoder) and not bool(mask[:, -1].all()):
        raise ValueError("the prompt is right-padded: a decoder continues each row's last position, "
                         "so pad on the left")
    return mask


def _token_ids(value, name: str, vocab_size: Optional[int], device) -> Optional[torch.Tensor]:
    """An id or a list of ids as a (n,) tensor, each in [0, vocab_size) unless vocab_size is None."""
    if value is None:
        return None
    ids = [value] if isinstance(value, int) else list(value)
    limit = float("inf") if vocab_size is None else vocab_size
    if not ids or any(not isinstance(i, int) or not 0 <= i < limit for i in ids):
        raise ValueError(f"{name}={value!r} must be token ids in [0, {vocab_size})")
    return torch.tensor(ids, dtype=torch.long, device=device)


def _special_ids(model, eos, pad, start, bos, forced_eos, suppress) -> dict:
    """Stop, pad, start, forced and suppressed ids: the arguments, else the model config's. A config's
    stop id outside the vocabulary is kept, as the reference keeps it: it is never produced."""
    cfg, device, V = model.config, model.tokens.weight.device, model.config.vocab_size
    out = {"eos": _token_ids(cfg.eos_token_id if eos is None else eos, "eos_token_id",
                             None if eos is None else V, device),
           "suppress": _token_ids(suppress, "suppress_tokens", V, device)}
    # ids fed to the model (pad: after a row's stop) or indexing the scores must be in the vocabulary
    for key, name, given in (("pad", "pad_token_id", pad), ("start", "decoder_start_token_id", start),
                             ("bos", "forced_bos_token_id", bos),
                             ("forced_eos", "forced_eos_token_id", forced_eos)):
        value = getattr(cfg, name) if given is None else given
        ids = _token_ids(value, name, V, device)
        out[key] = None if ids is None else int(ids[0])
    if out["pad"] is None and out["eos"] is not None:
        out["pad"] = int(out["eos"][0])  # finished rows need a filler; the reference uses eos too
    if isinstance(model, EncoderDecoder) and out["start"] is None:
        raise ValueError("an encoder-decoder needs decoder_start_token_id (in the config or as an argument)")
    return out


def _check_options(beams: Beams, rule: Sampling, streamer, repetition_penalty, min_new_tokens, min_length,
                   no_repeat_ngram_size) -> None:
    if beams.num_beams > 1 and rule.do_sample:
        raise ValueError("beam search with sampling is not supported: use num_beams=1 or do_sample=False")
    if beams.num_beams > 1 and streamer is not None:
        raise ValueError("beam search cannot stream tokens: the best hypothesis is known only at the end")
    if beams.num_beams == 1 and not rule.do_sample and beams.num_return_sequences != 1:
        raise ValueError("greedy decoding returns one sequence per input: num_return_sequences must be 1")
    if not isinstance(beams.num_return_sequences, int) or beams.num_return_sequences < 1:
        raise ValueError(f"num_return_sequences must be an integer >= 1, got {beams.num_return_sequences!r}")
    if not repetition_penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
    for name, value in (("min_new_tokens", min_new_tokens), ("min_length", min_length),
                        ("no_repeat_ngram_size", no_repeat_ngram_size)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
