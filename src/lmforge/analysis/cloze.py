"""Cloze probes scored with a model's language-modelling head (LAMA-style, Petroni et al. 2019).

A probe (lmforge.data.probes) is a text with one "[MASK]" word, its answer and the
candidates to rank. Each candidate gets a log-likelihood:

- masked LMs: the word is replaced by as many mask tokens as the candidate has pieces,
  and the score is the sum of the log-probabilities of its pieces at those positions
  (all predicted at once, as BERT would fill them);
- causal LMs: the score is the log-likelihood of the whole text with the candidate put
  in, so the words after the blank count too (an agreement probe is decided there); the
  text starts after bos (else eos or sep), so its first piece is scored too.

Three measures per kind of probe, per group ("memory" / "context") and overall, each
next to what an untrained model scores in expectation:

- accuracy: the answer ranks first (ties count against it); chance = mean of 1 / n;
- mrr: mean reciprocal rank of the answer among the candidates (1 first, 1/2 second, ...);
  chance = mean of (1 + 1/2 + ... + 1/n) / n;
- margin: the answer's log-likelihood minus the mean of the other candidates', in nats;
  0 is no preference. It is graded, so it shows learning before the answer ranks first;
  margin_se is its standard error over the probes.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from lmforge.data.probes import MASK
from lmforge.generate import lm_head_name
from lmforge.utils.modes import evaluating


def _pieces(tokenizer, text: str) -> list:
    return tokenizer.encode(text, add_special_tokens=False).ids if text.strip() else []


def _masked_rows(tokenizer, probe: dict) -> list:
    """(ids, positions, candidate piece ids) per candidate, for a masked LM."""
    left, right = probe["text"].split(MASK)
    cls, sep, mask = (tokenizer.special_id(r) for r in ("cls", "sep", "mask"))
    # the text after the blank keeps its leading space, as LAMA's spans do: byte-level BPE (RoBERTa)
    # encodes a word after a space as a piece of its own ("Ġand"), and the sentence must read as written
    before, after = _pieces(tokenizer, left.rstrip()), _pieces(tokenizer, right.rstrip())
    rows = []
    for cand in probe["candidates"]:
        # the candidate's pieces as they appear after a space inside the sentence
        target = (_pieces(tokenizer, left.rstrip() + " " + cand)[len(before):] if before
                  else _pieces(tokenizer, cand))
        ids = (([cls] if cls is not None else []) + before + [mask] * len(target) + after
               + ([sep] if sep is not None else []))
        start = (cls is not None) + len(before)
        rows.append((ids, list(range(start, start + len(target))), target))
    return rows


def start_id(tokenizer) -> int:
    """The token a causal LM's cloze text starts after: bos, else the eos or sep that a causal LM's
    blocks put between documents (objectives/clm.py); a ValueError for a tokenizer with none."""
    for role in ("bos", "eos", "sep"):
        if tokenizer.special_id(role) is not None:
            return tokenizer.special_id(role)
    raise ValueError("cloze probes on a causal LM need a tokenizer with a bos, eos or sep token to start "
                     "the text after (else its first word, the blank in '[MASK] is a city in ...', is "
                     "unscored)")


def _causal_rows(tokenizer, probe: dict) -> list:
    """(ids, positions predicted, their ids) per candidate, for a causal LM: the whole text, every
    piece of it scored (a text starting with the blank read its candidate's first piece unscored)."""
    start = start_id(tokenizer)
    rows = []
    for cand in probe["candidates"]:
        ids = [start] + _pieces(tokenizer, probe["text"].replace(MASK, cand))
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
    device = next(model.parameters()).device  # a model training on a GPU is probed there
    hidden = model(input_ids.to(device), attention_mask=mask.to(device), run_heads=False).last_hidden_state
    head = head if head is not None else model.heads[lm_head_name(model)]
    # every row's predicted positions at once: one head product and one read back (on a GPU, one sync)
    flat = [(i, p, t) for i, (_, positions, targets) in enumerate(rows) for p, t in zip(positions, targets)]
    # (n,) each: the row, the position read (a causal LM predicts p from the state at p - 1), the target
    row, at, targets = torch.tensor(flat, dtype=torch.long).reshape(-1, 3).to(device).unbind(1)
    logp = head(hidden[row, at - int(causal)]).log_softmax(-1)  # (n, V), n = all rows' targets together
    picked = logp.gather(1, targets[:, None])[:, 0]  # (n,)
    sums = torch.zeros(len(rows), dtype=picked.dtype, device=device).index_add_(0, row, picked)
    return sums.tolist()


def _measures(cand: dict, answer: str) -> dict:
    """Right / reciprocal rank / margin of the answer among candidate scores, with their chance levels."""
    mine, others = cand[answer], [v for c, v in cand.items() if c != answer]
    rank = 1 + sum(v >= mine for v in others)  # a tie is not a win: never flatters an untrained model
    n = len(cand)
    return {"accuracy": float(rank == 1), "mrr": 1 / rank, "margin": mine - sum(others) / max(1, len(others)),
            "chance": 1 / n, "chance_mrr": sum(1 / k for k in range(1, n + 1)) / n}


def score_probes(model, tokenizer, probes: list, head=None, batch_probes: int = 16) -> dict:
    """Accuracy, MRR and log-likelihood margin of `model` on cloze `probes`, per kind, per group and
    overall, with chance levels; `head` is the LM head to score with (default: the model's own).
    Probes longer than the model's max_seq_len are left out; none left: an empty dict."""
    causal = model.config.architecture == "decoder"
    if model.config.architecture == "encoder-decoder":
        raise ValueError("cloze probes score encoders (masked LM) and decoders (causal LM) only")
    if not causal and tokenizer.special_id("mask") is None:
        raise ValueError("cloze probes on a masked LM need a tokenizer with a mask token")
    if causal:
        start_id(tokenizer)  # refused before any probe runs
    pad = tokenizer.special_id("pad") or 0
    with evaluating(model):  # a pretraining run probed mid-way goes on in its own mode
        sums = _summed(model, tokenizer, probes, head, batch_probes, causal, pad)
    groups = {p.get("group") for p in probes}
    order = [k for k in sums if k not in groups and k != "all"] + [k for k in sums if k in groups] + ["all"]
    return {k: _means(sums[k]) for k in order if k in sums}


def _summed(model, tokenizer, probes: list, head, batch_probes: int, causal: bool, pad: int) -> dict:
    """kind / group / "all" -> the sums of each measure over its probes (and n, margin^2)."""
    sums: dict = defaultdict(lambda: defaultdict(float))
    for start in range(0, len(probes), batch_probes):
        chunk = [(p, (_causal_rows if causal else _masked_rows)(tokenizer, p))
                 for p in probes[start: start + batch_probes]]
        # a probe longer than the model's positions is left out (its n shows it), never cut short
        chunk = [(p, rows)
                 for p, rows in chunk if max(len(ids) for ids, _, _ in rows) <= model.config.max_seq_len]
        if not chunk:
            continue
        scores = iter(_scores(model, [r for _, rows in chunk for r in rows], pad, causal, head))
        for p, _ in chunk:
            measures = _measures({c: next(scores) for c in p["candidates"]}, p["answer"])
            for key in (p["kind"], p.get("group"), "all"):
                if key is not None:
                    for name, value in {**measures, "n": 1, "margin2": measures["margin"] ** 2}.items():
                        sums[key][name] += value
    return sums


def _means(s: dict) -> dict:
    """Sums over n probes -> means, plus the margin's standard error (is a small margin real?)."""
    n = s["n"]
    out = {name: v / n for name, v in s.items() if name not in ("n", "margin2")}
    variance = max(0.0, s["margin2"] / n - out["margin"] ** 2) * n / max(1, n - 1)
    return {**out, "margin_se": (variance / n) ** 0.5, "n": int(n)}


def compare(untrained: dict, trained: dict) -> list:
    """Lines for the overall and per-group scores: each measure untrained -> trained [chance]."""
    lines = []
    for key in [k for k in ("context", "memory") if k in trained] + ["all"]:
        u, t = untrained[key], trained[key]
        lines.append(f"{key:8s} accuracy {u['accuracy']:.3f}->{t['accuracy']:.3f} [{t['chance']:.3f}]  "
                     f"MRR {u['mrr']:.3f}->{t['mrr']:.3f} [{t['chance_mrr']:.3f}]  "
                     f"margin {u['margin']:+.3f}->{t['margin']:+.3f}+-{t['margin_se']:.3f} nats [0]  "
                     f"n={t['n']}")
    return lines
