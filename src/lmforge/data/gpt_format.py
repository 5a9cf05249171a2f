"""GPT's task-specific input transformations (Radford et al. 2018, sec. 3.3 and fig. 1).

A decoder reads one token sequence, so each structured input becomes one (or several)
sequences between a start token and an extract token, with a delimiter between parts:

    classification   [START] text [EXTRACT]
    entailment       [START] premise [DELIM] hypothesis [EXTRACT]
    similarity       [START] a [DELIM] b [EXTRACT] and [START] b [DELIM] a [EXTRACT]: the two
                     sentences have no natural order, so both are read and the two final
                     states are added before the linear output layer
    multiple choice  [START] context [DELIM] answer_k [EXTRACT] for each answer k; a softmax
                     over the answers' scores

The score is read at the [EXTRACT] position: the last real token, i.e. a classification
head with pooling="last" (heads.py), as GPT-2 and Llama sequence classifiers do.

Adding the tokens: `add_task_tokens(tokenizer)` registers [START], [DELIM] and [EXTRACT] as
special tokens of the tokenizer (never split or normalised, skipped by decode) with the next
free ids, and returns them; `grow_vocabulary(model, tokenizer.vocab_size)` then adds rows to
the model's token table (and its LM head), randomly initialised as GPT's new tokens are,
keeping every pretrained row. Save the tokenizer with the model so the ids travel together.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tokenizers import AddedToken
from torch import nn

TASK_TOKENS = ("[START]", "[DELIM]", "[EXTRACT]")


@dataclass(frozen=True)
class TaskTokens:
    """Ids of the start, delimiter and extract tokens."""

    start: int
    delim: int
    extract: int


def add_task_tokens(tokenizer, names: tuple = TASK_TOKENS) -> TaskTokens:
    """Add the three task tokens to `tokenizer` (an lmforge Tokenizer) unless present; their ids."""
    missing = [n for n in names if tokenizer.token_to_id(n) is None]
    tokenizer.backend.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in missing])
    return TaskTokens(*(tokenizer.token_to_id(n) for n in names))


def grow_vocabulary(model: nn.Module, vocab_size: int, std: float = 0.02) -> nn.Module:
    """Give `model` vocab_size token rows: old rows kept, new ones N(0, std); the LM head follows."""
    old = model.config.vocab_size
    if vocab_size < old:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the model's {old}")
    table = model.tokens.weight
    extra = torch.randn(vocab_size - old, table.shape[1], dtype=table.dtype, device=table.device) * std
    # the same Embedding module keeps its new weight, so a tied LM head (which holds the
    # module) projects onto the grown table without being rebuilt
    model.tokens.weight = nn.Parameter(torch.cat([table.detach(), extra]))
    model.tokens.num_embeddings = vocab_size
    for head in model.heads.values():
        if head.spec.get("kind") == "lm":
            _grow_lm_head(head, vocab_size, std)
    model.config = model.config.replace(vocab_size=vocab_size)
    return model


def _grow_lm_head(head: nn.Module, vocab_size: int, std: float) -> None:
    if head.decoder is not None:  # an untied output projection: new rows too
        w = head.decoder.weight
        extra = torch.randn(vocab_size - w.shape[0], w.shape[1], dtype=w.dtype, device=w.device) * std
        head.decoder.weight = nn.Parameter(torch.cat([w.detach(), extra]))
        head.decoder.out_features = vocab_size
    if head.bias is not None:
        b = head.bias
        head.bias = nn.Parameter(torch.cat([b.detach(), b.new_zeros(vocab_size - b.shape[0])]))


def _fit(parts: list, budget: int) -> list:
    """Cut the longest part's end until the parts fit in `budget` tokens (deterministic)."""
    if budget < 0:
        raise ValueError("max_len leaves no room next to the task tokens")
    parts = [list(p) for p in parts]
    while sum(map(len, parts)) > budget:
        longest = max(range(len(parts)), key=lambda i: len(parts[i]))
        parts[longest].pop()
    return parts


def classification(text: list, tokens: TaskTokens, max_len: int | None = None) -> list:
    """[START] text [EXTRACT]."""
    (text,) = _fit([text], max_len - 2) if max_len else [text]
    return [tokens.start, *text, tokens.extract]


def entailment(premise: list, hypothesis: list, tokens: TaskTokens, max_len: int | None = None) -> list:
    """[START] premise [DELIM] hypothesis [EXTRACT]."""
    p, h = _fit([premise, hypothesis], max_len - 3) if max_len else (premise, hypothesis)
    return [tokens.start, *p, tokens.delim, *h, tokens.extract]


def similarity(a: list, b: list, tokens: TaskTokens, max_len: int | None = None) -> list:
    """Both orders: [entailment(a, b), entailment(b, a)] (their final states are added)."""
    return [entailment(a, b, tokens, max_len), entailment(b, a, tokens, max_len)]


def multiple_choice(context: list, answers: list, tokens: TaskTokens, max_len: int | None = None) -> list:
    """One [START] context [DELIM] answer [EXTRACT] per answer (a question joins the context)."""
    if not answers:
        raise ValueError("multiple choice needs at least one answer")
    return [entailment(context, answer, tokens, max_len) for answer in answers]
