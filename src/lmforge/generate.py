"""Text generation for decoders and encoder-decoders with a KV cache.

Greedy decoding, temperature sampling, top-k (Fan et al. 2018), nucleus / top-p
(Holtzman et al. 2020) and the repetition penalty of Keskar et al. (2019); stop tokens,
a budget of new tokens and left-padded batches. Decoders return prompt + new tokens;
encoder-decoders return the decoder's tokens, starting with the decoder start token —
the same shapes the reference library's `generate` returns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from lmforge.layers.attention import KVCache
from lmforge.model import EncoderDecoder, Transformer


@dataclass
class Sampling:
    """How the next token is chosen from the logits (greedy unless do_sample)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter
    repetition_penalty: float = 1.0  # 1.0: none; > 1 discourages tokens already in the sequence

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature} (use do_sample=False for greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.repetition_penalty <= 0:
            raise ValueError("top_k must be >= 0 and repetition_penalty > 0")


def penalise_repetition(scores: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Divide positive (multiply negative) scores of tokens already in `seen` by `penalty`."""
    # scores (B, V); seen (B, T) token ids of the sequence so far
    picked = scores.gather(1, seen)
    picked = torch.where(picked < 0, picked * penalty, picked / penalty)
    return scores.scatter(1, seen, picked)


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


def next_tokens(scores: torch.Tensor, seen: torch.Tensor, rule: Sampling,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """(B, V) next-position logits -> (B,) chosen token ids."""
    scores = scores.float()
    if rule.repetition_penalty != 1.0:
        scores = penalise_repetition(scores, seen, rule.repetition_penalty)
    if not rule.do_sample:
        return scores.argmax(-1)
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


def _stop_ids(eos_token_id, device) -> Optional[torch.Tensor]:
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    return torch.tensor(ids, device=device)


class _Decoding:
    """The state of one batch being decoded: tokens so far, finished rows, stop ids."""

    def __init__(self, tokens, eos_token_id, pad_token_id) -> None:
        self.tokens = tokens  # (B, T) everything generated so far (decoders: with the prompt)
        self.stop = _stop_ids(eos_token_id, tokens.device)
        if self.stop is not None and pad_token_id is None:
            pad_token_id = int(self.stop[0])  # finished rows need a filler; the reference uses eos too
        self.pad = pad_token_id
        self.done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)

    def append(self, chosen: torch.Tensor) -> torch.Tensor:
        """Add (B,) chosen tokens (pad on finished rows); return what was added."""
        if self.stop is not None:
            chosen = torch.where(self.done, torch.full_like(chosen, self.pad), chosen)
            self.done |= torch.isin(chosen, self.stop)
        self.tokens = torch.cat([self.tokens, chosen[:, None]], dim=1)
        return chosen

    @property
    def finished(self) -> bool:
        """Every row has produced a stop token."""
        return bool(self.done.all())


@torch.no_grad()
def generate(model: Transformer, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, *,
             max_new_tokens: int = 20, do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, repetition_penalty: float = 1.0, eos_token_id=None, pad_token_id=None,
             decoder_start_token_id: Optional[int] = None, generator: Optional[torch.Generator] = None,
             streamer: Optional[Callable] = None) -> torch.Tensor:
    """Continue `input_ids` (B, T), left-padded when `attention_mask` has zeros.

    Decoders return (B, T + n) prompt and new tokens; encoder-decoders return (B, 1 + n)
    decoder tokens. Stop ids default to the config's eos; `streamer` receives each step's
    (B,) new tokens."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    rule = Sampling(do_sample, temperature, top_k, top_p, repetition_penalty)
    cfg = model.config
    eos = cfg.eos_token_id if eos_token_id is None else eos_token_id
    pad = cfg.pad_token_id if pad_token_id is None else pad_token_id
    head = lm_head_name(model)
    was_training = model.training
    model.eval()
    try:
        if isinstance(model, EncoderDecoder):
            start = cfg.decoder_start_token_id if decoder_start_token_id is None else decoder_start_token_id
            if start is None:
                raise ValueError("an encoder-decoder needs decoder_start_token_id (in the config or as an argument)")
            _check_length(model, 1, max_new_tokens)
            run = _encoder_decoder_steps(model, input_ids, attention_mask, start, head)
            state = _Decoding(torch.full((input_ids.shape[0], 1), start, dtype=torch.long,
                                         device=input_ids.device), eos, pad)
        else:
            _check_length(model, input_ids.shape[-1], max_new_tokens)
            run = _decoder_steps(model, input_ids, attention_mask, head)
            state = _Decoding(input_ids, eos, pad)
        scores = next(run)
        for step in range(max_new_tokens):
            chosen = state.append(next_tokens(scores, state.tokens, rule, generator))
            if streamer is not None:
                streamer(chosen)
            if state.finished or step == max_new_tokens - 1:
                break
            scores = run.send(chosen)
        return state.tokens
    finally:
        model.train(was_training)


def _check_length(model, T: int, max_new_tokens: int) -> None:
    # fail before any work rather than at the step that runs past the position table
    if T + max_new_tokens - 1 > model.config.max_seq_len:
        raise ValueError(f"{T} starting tokens plus max_new_tokens={max_new_tokens} exceed "
                         f"max_seq_len={model.config.max_seq_len}")


def _decoder_steps(model, input_ids, attention_mask, head: str):
    """Yield next-position logits: the prompt once, then one new token per step."""
    B = input_ids.shape[0]
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    mask = mask.long()
    # left padding: each row's first real token is at position 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = KVCache()
    lm = model.heads[head]
    # the head runs on the last position only: a prompt's vocabulary projection is skipped
    out = model(input_ids, mask, position_ids=positions, cache=cache, run_heads=False)
    while True:
        chosen = yield lm(out.last_hidden_state[:, -1])
        mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
        positions = positions[:, -1:] + 1
        out = model(chosen[:, None], mask, position_ids=positions, cache=cache, run_heads=False)


def _encoder_decoder_steps(model, input_ids, attention_mask, start: int, head: str):
    """Yield next-position logits of the decoder; the encoder runs once."""
    encoded = model.encode(input_ids, attention_mask)
    cache = KVCache()
    tokens = torch.full((input_ids.shape[0], 1), start, dtype=torch.long, device=input_ids.device)
    lm = model.heads[head]
    while True:
        out = model(attention_mask=attention_mask, decoder_input_ids=tokens, encoder_output=encoded,
                    cache=cache, run_heads=False)
        tokens = (yield lm(out.last_hidden_state[:, -1]))[:, None]
