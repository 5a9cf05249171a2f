"""GPT-2 small greedy generation, side by side: 64 new tokens after a 32-token prompt."""
from __future__ import annotations

import torch

from common import pair, ratio, side_by_side



def greedy_generation(repeats: int, quick: bool) -> list:
    """New tokens/s of lmforge.generate and the reference's generate (greedy, KV cache) at batch 1 and 8."""
    from transformers import GPT2Config, GPT2LMHeadModel

    import lmforge

    torch.manual_seed(0)
    reference, ours = pair(GPT2LMHeadModel(GPT2Config()))
    # no stop token on either side: every row generates all 64 tokens in both libraries
    reference.generation_config.eos_token_id = None
    reference.generation_config.pad_token_id = 0
    ours.config = ours.config.replace(eos_token_id=None)
    rows = []
    new = 16 if quick else 64
    for size in (1, 8):
        ids = torch.randint(1000, reference.config.vocab_size, (size, 32), generator=torch.Generator().manual_seed(size))
        mask = torch.ones_like(ids)

        def theirs():
            return reference.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False)

        def mine():
            return lmforge.generate(ours, ids, mask, max_new_tokens=new, pad_token_id=0)

        with torch.inference_mode():
            same = bool(torch.equal(mine(), theirs()))
            runs = side_by_side({"lmforge": mine, "reference": theirs}, repeats)
        tokens = size * new
        ours_s, theirs_s = runs["lmforge"]["median"], runs["reference"]["median"]
        rows.append({"model": "gpt2", "batch": size, "new_tokens": tokens, "lmforge_tok_s": tokens / ours_s,
                     "reference_tok_s": tokens / theirs_s, "ratio": ratio(theirs_s, ours_s),
                     "same_tokens": same, "useful_flops": tokens * 2 * 124.4e6, "runs": runs})
    return rows
