"""T5's other unsupervised objectives (Raffel et al. 2020, sec. 3.3.1, Table 4), for comparison with
span corruption on one encoder-decoder: the target is always the whole original text.

- BERT-style: 15 % of the tokens are corrupted, 90 % of those to a mask token and 10 % to a random
  token; T5's vocabulary has no [MASK], so the mask is its first sentinel <extra_id_0> (which span
  corruption uses the same way: a token that stands for what was removed);
- deshuffling: the tokens are shuffled and the model restores their order.

Both are BART's Denoising (denoising.py) with a noise of their own, on T5's text: blocks of raw
tokens, documents concatenated without a separator (T5's reduce_concat_tokens); as T5 does, </s> is
appended to the noised input and to the target, so every target ends in it and nowhere else.
"""
from __future__ import annotations

from functools import partial

import torch

from lmforge.data.stream import ExampleFormat
from lmforge.objectives.base import one_of, tokenizer_pad, within
from lmforge.objectives.denoising import Denoising, chosen_positions
from lmforge.objectives.registry import ObjectiveSpec, register
from lmforge.objectives.t5_span_corruption import sentinel_ids

MASK_SHARE = 0.9  # of the corrupted tokens, the share that becomes the mask; the rest random tokens


def bert_style(tokens: list, generator: torch.Generator, mask_id: int, vocab_size: int,
               p: float = 0.15) -> list:
    """T5's BERT-style noise: a random p of the tokens corrupted, 90 % to mask_id, 10 % to a random token."""
    chosen = sorted(chosen_positions(len(tokens), p, generator))
    draws = torch.rand(len(chosen), generator=generator).tolist()
    randoms = torch.randint(0, vocab_size, (len(chosen),), generator=generator).tolist()
    out = list(tokens)
    for i, u, r in zip(chosen, draws, randoms):
        out[i] = mask_id if u < MASK_SHARE else r
    return out


def deshuffle(tokens: list, generator: torch.Generator) -> list:
    """T5's deshuffling noise: the tokens in a uniformly random order."""
    return [tokens[i] for i in torch.randperm(len(tokens), generator=generator).tolist()]


class T5Denoising(Denoising):
    """Reconstruct T5's text from BERT-style corruption (style="bert") or from its shuffled tokens
    (style="deshuffle")."""

    name = "t5-denoising"
    # rate: the share of tokens BERT-style corrupts (deshuffling reads none)
    bounds = {**Denoising.bounds, "style": one_of(("bert", "deshuffle")),
              "rate": within(0, 1, above=True, below=True)}

    @classmethod
    def build(cls, model, tokenizer, style: str = "bert", rate: float = 0.15) -> T5Denoising:
        """The objective around an encoder-decoder, with T5's first sentinel as the mask, </s> and pad."""
        cls.check_values({"style": style, "rate": rate})
        if style == "bert":
            mask = tokenizer.special_id("mask")
            mask = mask if mask is not None else sentinel_ids(tokenizer, 1)[0]
            noise = partial(bert_style, mask_id=mask, vocab_size=model.config.vocab_size, p=rate)
        else:
            noise = deshuffle
        return cls(model, None, noises=(noise,), ends=(None, tokenizer.special_id("eos")),
                   pad_id=tokenizer_pad(tokenizer))

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """Raw tokens (a final </s>, if any, set aside) -> noised tokens + </s> in, tokens + </s> out."""
        ids = list(example["input_ids"])
        if self.eos_id is not None and ids[-1:] == [self.eos_id]:
            ids = ids[:-1]
        end = [self.eos_id] if self.eos_id is not None else []
        return {"input_ids": self.noise(ids, generator) + end, "labels": ids + end}


# T5's raw text: documents run together (no joiner), room for the </s> appended to the input
_BLOCKS = ExampleFormat("blocks", roles=(), reserve=1)
register(ObjectiveSpec(name="t5-bert-style", build=T5Denoising.build,
                       summary="BERT-style denoising, whole text as target (T5)",
                       architectures=("encoder-decoder",), tokenizer="t5", examples=_BLOCKS,
                       options={"style": "bert"}))
register(ObjectiveSpec(name="t5-deshuffling", build=T5Denoising.build, summary="deshuffling (T5)",
                       architectures=("encoder-decoder",), tokenizer="t5", examples=_BLOCKS,
                       options={"style": "deshuffle"}))
