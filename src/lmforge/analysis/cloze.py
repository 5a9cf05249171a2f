"""Cloze probes scored with a model's language-modelling head (LAMA-style, Petroni et al. 2019).

A probe (lmforge.data.probes) is a text with one "[MASK]" word, its answer and the
candidates to rank. Each candidate gets a log-likelihood and the probe counts as right
when the answer ranks first:

- masked LMs: the word is replaced by as many mask tokens as the candidate has pieces,
  and the score is the sum of the log-probabilities of its pieces at those positions
  (all predicted at once, as BERT would fill them);
- causal LMs: the score is the log-likelihood of the whole text with the candidate put
  in, so the words after the blank count too (an agreement probe is decided there).

Accuracy is reported per kind of probe and overall, next to the chance level (the mean
of 1 / number of candidates), which is what an untrained model scores on average.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from lmforge.data.probes import MASK
from lmforge.generate import lm_head_name


def _pieces(tokenizer, text: str) -> list:
    return tokenizer.encode(text, add_special_tokens=False).ids if text.strip() else []


def _masked_rows(tokenizer, probe: dict) -> list:
    """(ids, positions, candidate piece ids) per candidate, for a masked LM."""
    left, right = probe["text"].split(MASK)
    cls, sep, mask = (tokenizer.special_id(r) for r in ("cls", "sep", "mask"))
    before, after = _pieces(tokenizer, left.rstrip()), _pieces(tokenizer, right.lstrip())
    rows = []
    for cand in probe["candidates"]:
        # the candidate's pieces as they appear after a space inside the sentence
        target = _pieces(tokenizer, left.rstrip() + " " + cand)[len(before):] if before else _pieces(tokenizer, cand)
        ids = ([cls] if cls is not None else []) + before + [mask] * len(target) + after + ([sep] if sep is not None else [])
        start = (cls is not None) + len(before)
        rows.append((ids, list(range(start, start + len(target))), target))
    return rows


def _causal_rows(tokenizer, probe: dict) -> list:
    """(ids, positions predicted, their ids) per candidate, for a causal LM: the whole text."""
    bos = tokenizer.special_id("bos")
    rows = []
    for cand in probe["candidates"]:
        ids = ([bos] if bos is not None else []) + _pieces(tokenizer, probe["text"].replace(MASK, cand))
        rows.append((ids, list(range(1, len(ids))), ids[1:]))
    return rows


@torch.no_grad()
def _scores(model, rows: list, pad_id: int, causal: bool, head=None) -> list:
    """Sum of log-probabilities of each row's targets; rows are scored in one padded batch."""
    T = max(len(ids) for ids, _, _ in rows)
    input_ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, (ids, _, _) in enumerate(rows):
        input_ids[i, : len(ids)], mask[i, : len(ids)] = torch.tensor(ids), 1
    hidden = model(input_ids, attention_mask=mask, run_heads=False).last_hidden_state  # (B, T, C)
    head = head if head is not None else model.heads[lm_head_name(model)]
    out = []
    for i, (_, positions, targets) in enumerate(rows):
        # a causal LM predicts position p from the hidden state at p - 1
        at = torch.tensor(positions) - (1 if causal else 0)
        logp = head(hidden[i, at]).log_softmax(-1)  # (n, V)
        out.append(float(logp[torch.arange(len(targets)), torch.tensor(targets)].sum()))
    return out


def score_probes(model, tokenizer, probes: list, head=None, batch_probes: int = 16) -> dict:
    """Accuracy of `model` on cloze `probes`, per kind and overall, with the chance level; `head` is
    the LM head to score with (default: the model's own)."""
    causal = model.config.architecture == "decoder"
    if model.config.architecture == "encoder-decoder":
        raise ValueError("cloze probes score encoders (masked LM) and decoders (causal LM) only")
    if not causal and tokenizer.special_id("mask") is None:
        raise ValueError("cloze probes on a masked LM need a tokenizer with a mask token")
    pad = tokenizer.special_id("pad") or 0
    was_training = model.training
    model.eval()
    right, total, chance = defaultdict(int), defaultdict(int), defaultdict(float)
    for start in range(0, len(probes), batch_probes):
        chunk = probes[start: start + batch_probes]
        rows = [r for p in chunk for r in (_causal_rows if causal else _masked_rows)(tokenizer, p)]
        scores = iter(_scores(model, rows, pad, causal, head))
        for p in chunk:
            cand = {c: next(scores) for c in p["candidates"]}
            for key in (p["kind"], "all"):
                right[key] += max(cand, key=cand.get) == p["answer"]
                total[key] += 1
                chance[key] += 1 / len(p["candidates"])
    model.train(was_training)
    return {k: {"accuracy": right[k] / total[k], "chance": chance[k] / total[k], "n": total[k]} for k in total}
