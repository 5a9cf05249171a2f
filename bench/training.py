"""Training steps (BERT MLM, GPT-2 causal LM) side by side: tokens/s and peak memory."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from bench.common import batch, bert_config, encoder_flops, pair, peak_during, ratio, side_by_side

MASK_ID, RATE = 103, 0.15


def mlm_batch(vocab: int, seed: int = 0) -> dict:
    """32 x 128 full rows, 15 % of positions selected: 80 % [MASK], 10 % random, 10 % kept."""
    ids, mask = batch(32, 128, vocab, variable=False, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    selected = torch.rand(ids.shape, generator=gen) < RATE
    labels = ids.masked_fill(~selected, -100)
    u = torch.rand(ids.shape, generator=gen)
    corrupted = torch.where(selected & (u < 0.8), MASK_ID, ids)
    corrupted = torch.where(selected & (u >= 0.8) & (u < 0.9), torch.randint(1000, vocab, ids.shape, generator=gen),
                            corrupted)
    return {"input_ids": corrupted, "attention_mask": mask, "labels": labels}


def _steps(kind: str, name: str, check: bool = True):
    """{impl: one optimiser step} for kind "mlm" (BERT size `name`) or "clm" (GPT-2 small)."""
    from transformers import BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    from lmforge.objectives.clm import CausalLM
    from lmforge.objectives.mlm import MaskedLM

    torch.manual_seed(0)
    if kind == "mlm":
        reference, ours = pair(BertForMaskedLM(bert_config(name)))
        data = mlm_batch(reference.config.vocab_size)
        objective = MaskedLM(ours, mask_id=MASK_ID)
        ref_args = dict(input_ids=data["input_ids"], attention_mask=data["attention_mask"], labels=data["labels"])
    else:
        reference, ours = pair(GPT2LMHeadModel(GPT2Config()))
        ids, mask = batch(8, 128, reference.config.vocab_size, variable=False)
        data = {"input_ids": ids, "attention_mask": mask}
        objective = CausalLM(ours)
        ref_args = dict(input_ids=ids, attention_mask=mask, labels=ids)
    diff = None
    if check:  # same loss before any step (eval mode: no dropout)
        with torch.no_grad():
            diff = abs(float(objective(data).loss) - float(reference(**ref_args).loss))
    reference.train()
    objective.train()
    opt = {"lmforge": torch.optim.AdamW(objective.parameters(), lr=1e-5),
           "reference": torch.optim.AdamW(reference.parameters(), lr=1e-5)}

    def step(impl: str):
        loss = objective(data).loss if impl == "lmforge" else reference(**ref_args).loss
        loss.backward()
        opt[impl].step()
        opt[impl].zero_grad(set_to_none=True)

    tokens = float(data["attention_mask"].sum())
    return {"lmforge": lambda: step("lmforge"), "reference": lambda: step("reference")}, tokens, diff, reference


def training_step(repeats: int, quick: bool) -> list:
    """MLM steps of bert-mini and bert-small and a GPT-2 small causal-LM step."""
    rows = []
    cases = [("mlm", "bert-mini"), ("mlm", "bert-small")] + ([] if quick else [("clm", "gpt2")])
    for kind, name in cases:
        fns, tokens, diff, reference = _steps(kind, name)
        runs = side_by_side(fns, repeats)
        memory = {impl: _child_memory(kind, name, impl) for impl in fns}
        ours_s, theirs_s = runs["lmforge"]["median"], runs["reference"]["median"]
        flops = _useful_flops(kind, reference.config)
        rows.append({"model": name, "objective": kind, "tokens": tokens, "lmforge_tok_s": tokens / ours_s,
                     "reference_tok_s": tokens / theirs_s, "ratio": ratio(theirs_s, ours_s),
                     "lmforge_peak_mib": memory["lmforge"], "reference_peak_mib": memory["reference"],
                     "memory_ratio": ratio(memory["lmforge"], memory["reference"]),
                     "useful_flops": flops, "initial_loss_diff": diff, "runs": runs})
    return rows


def _useful_flops(kind: str, cfg) -> float:
    """Forward + backward (3x forward) FLOPs of the work a step needs: the backbone on every token
    and the vocabulary projection where there is a label (15 % for MLM, every position for CLM)."""
    if kind == "mlm":
        mask = torch.ones(32, 128)
        backbone = encoder_flops(cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, mask)
        head = RATE * mask.numel() * 2 * (cfg.hidden_size ** 2 + cfg.hidden_size * cfg.vocab_size)
    else:
        mask = torch.ones(8, 128)
        d, pairs = cfg.n_embd, 8 * 128 * 129 / 2  # causal: each query meets the keys up to itself
        backbone = cfg.n_layer * (2 * 12 * d * d * mask.numel() + 4 * d * pairs)
        head = mask.numel() * 2 * cfg.n_embd * cfg.vocab_size
    return 3 * (backbone + head)


def _child_memory(kind: str, name: str, impl: str) -> float:
    """Peak resident-set growth over two steps, measured in a fresh process (the high-water mark
    of one process cannot separate two models)."""
    code = ("import json; from bench import training; "
            f"print(json.dumps(training.memory_of({kind!r}, {name!r}, {impl!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy(),
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory_of(kind: str, name: str, impl: str) -> float:
    """MiB a process grows by during two optimiser steps of one implementation."""
    fns, *_ = _steps(kind, name, check=False)
    return round(peak_during(fns[impl], runs=2), 1)
