"""GPT-2 small greedy generation, side by side: 64 new tokens after a 32-token prompt.

Two lmforge models meet the same reference model: one converted from it (the same weights, so
the tokens must match) and one initialised by lmforge (N(0, 0.02), its own weights), because a
fast path may pay on one set of weights and not on another. Each row says which fast paths ran.
"""
from __future__ import annotations

import torch

from bench.common import pair, ratio, side_by_side


def _fast_paths(model, batch: int) -> dict:
    """What generate chose for this model and batch on this machine (generate/vocab/projection.py)."""
    from lmforge.generate.vocab.projection import CHOICES

    weight, _ = model.heads["lm"].projection()
    key = (*weight.shape, batch, True, torch.get_num_threads())
    way, screen_timed = CHOICES.get(key, ("plain", False))
    return {"projection": way, "screen_timed": screen_timed, "optimized": True}


def greedy_generation(repeats: int, quick: bool) -> list:
    """New tokens/s of lmforge.generate and the reference's generate (greedy, KV cache) at batch 1 and 8."""
    from transformers import GPT2Config, GPT2LMHeadModel

    import lmforge
    from lmforge.fast.paths import FastPaths
    from lmforge.heads import attach

    torch.manual_seed(0)
    reference, converted = pair(GPT2LMHeadModel(GPT2Config()))
    # no stop token on either side: every row generates all 64 tokens in both libraries
    reference.generation_config.eos_token_id = None
    reference.generation_config.pad_token_id = 0
    converted.config = converted.config.replace(eos_token_id=None)
    native = lmforge.build("gpt2", eos_token_id=None).eval()
    attach(native, "lm")
    # as the converted arm (bench.common.pair) and lmforge's generate job run a model
    lmforge.optimize(native, paths=FastPaths.frozen())
    rows = []
    new = 16 if quick else 64
    for weights, ours in (("converted", converted), ("lmforge-init", native)):
        for size in (1, 8):
            rows.append(_row(reference, ours, weights, size, new, repeats))
    return rows


def _row(reference, ours, weights: str, size: int, new: int, repeats: int) -> dict:
    import lmforge

    ids = torch.randint(1000, reference.config.vocab_size, (size, 32), generator=torch.Generator().manual_seed(size))
    mask = torch.ones_like(ids)

    def theirs():
        return reference.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False)

    def mine():
        return lmforge.generate(ours, ids, mask, max_new_tokens=new, pad_token_id=0)

    with torch.inference_mode():
        same = bool(torch.equal(mine(), theirs())) if weights == "converted" else None
        runs = side_by_side({"lmforge": mine, "reference": theirs}, repeats)
    tokens = size * new
    ours_s, theirs_s = runs["lmforge"]["median"], runs["reference"]["median"]
    return {"model": "gpt2", "weights": weights, "batch": size, "new_tokens": tokens,
            "lmforge_tok_s": tokens / ours_s, "reference_tok_s": tokens / theirs_s, "ratio": ratio(theirs_s, ours_s),
            "same_tokens": same, "fast_paths": _fast_paths(ours, size), "useful_flops": tokens * 2 * 124.4e6,
            "runs": runs}
