"""BART's noising functions and denoising objective (Lewis et al. 2020, sec. 2.2 and fig. 2).

Each noise is a function (tokens, generator) -> tokens over the text between <s> and </s>,
drawing only from the generator; they compose by running one after another:

- token masking: random tokens become <mask> (as BERT, without the 10 % random / 10 % kept);
- token deletion: random tokens are removed, so the model must find where input is missing;
- text infilling: span lengths ~ Poisson(lambda = 3) cover a budget of the tokens (30 % in
  BART's large-scale pretraining, sec. 5.1); each span becomes ONE <mask>, so the model must
  also predict how many tokens a mask stands for, and a zero-length span inserts a <mask>;
- sentence permutation: the sentences (runs ending at a sentence-end token) are shuffled;
- document rotation: the text is rotated to begin at a uniformly random token.

`Denoising` trains an encoder-decoder to reproduce the original text from the noised one
(teacher forcing; target = the original <s> text </s>). Its default noise is text infilling
after sentence permutation, the combination of BART's final models (sec. 5.1).

Budgets (masking, deletion, infilling) are p x n rounded up or down at random, so the
expected fraction is exactly p. Infilling places its spans without overlap, uniformly
among the kept tokens (fairseq lets random starts overlap and merge).
"""
from __future__ import annotations

from functools import partial

import torch

from lmforge.data.stream import ExampleFormat
from lmforge.objectives.base import check_bounds, tokenizer_mask, tokenizer_pad, within
from lmforge.objectives.mlm import budget
from lmforge.objectives.registry import ObjectiveSpec, register
from lmforge.objectives.seq2seq import Seq2SeqLM


def chosen_positions(n: int, p: float, generator: torch.Generator) -> set:
    """A uniformly random set of budget(n, p) positions out of n."""
    k = budget(n, p, generator)
    return set(torch.randperm(n, generator=generator)[:k].tolist())


def token_masking(tokens: list, generator: torch.Generator, mask_id: int, p: float = 0.15) -> list:
    """Replace a random p of the tokens by mask_id."""
    chosen = chosen_positions(len(tokens), p, generator)
    return [mask_id if i in chosen else t for i, t in enumerate(tokens)]


def token_deletion(tokens: list, generator: torch.Generator, p: float = 0.15) -> list:
    """Delete a random p of the tokens."""
    chosen = chosen_positions(len(tokens), p, generator)
    return [t for i, t in enumerate(tokens) if i not in chosen]


def infilling_spans(n: int, generator: torch.Generator, p: float = 0.3, poisson_lambda: float = 3.0) -> list:
    """Span lengths ~ Poisson(lambda), drawn until they cover budget(n, p) tokens (the last one
    cut to fit); zeros stay in the list (insertions)."""
    need, lengths = budget(n, p, generator), []
    rate = torch.tensor(float(poisson_lambda))
    while need > 0:
        length = min(int(torch.poisson(rate, generator=generator)), need)
        lengths.append(length)
        need -= length
    return lengths


def text_infilling(tokens: list, generator: torch.Generator, mask_id: int, p: float = 0.3,
                   poisson_lambda: float = 3.0) -> list:
    """Replace Poisson-length spans covering p of the tokens by one mask_id each."""
    lengths = infilling_spans(len(tokens), generator, p, poisson_lambda)
    kept = len(tokens) - sum(lengths)
    # kept tokens and spans in a uniformly random arrangement: which of the slots are spans
    slots = kept + len(lengths)
    is_span = torch.zeros(slots, dtype=torch.bool)
    is_span[torch.randperm(slots, generator=generator)[: len(lengths)]] = True
    out, i, spans = [], 0, iter(lengths)
    for span in is_span.tolist():
        if span:
            out.append(mask_id)
            i += next(spans)
        else:
            out.append(tokens[i])
            i += 1
    return out


def sentences(tokens: list, sentence_end: int) -> list:
    """The runs of tokens ending at each sentence_end token (and the rest, if any)."""
    out, current = [], []
    for t in tokens:
        current.append(t)
        if t == sentence_end:
            out.append(current)
            current = []
    return out + [current] if current else out


def sentence_permutation(tokens: list, generator: torch.Generator, sentence_end: int) -> list:
    """Shuffle the sentences into a uniformly random order."""
    parts = sentences(tokens, sentence_end)
    return [t for k in torch.randperm(len(parts), generator=generator).tolist() for t in parts[k]]


def document_rotation(tokens: list, generator: torch.Generator) -> list:
    """Rotate so the text begins at a uniformly random token."""
    if not tokens:
        return []
    start = int(torch.randint(len(tokens), (), generator=generator))
    return tokens[start:] + tokens[:start]


NOISES = ("token-masking", "token-deletion", "text-infilling", "sentence-permutation", "document-rotation")
# a ratio is a budget's share of the tokens. Spans are drawn until they cover the budget and an empty one
# inserts a mask: lambda 0 drew forever, and below 0.5 most draws are insertions (about e^-lambda / lambda a
# masked token), so the noised text outgrows its source; BART's is 3
NOISE_BOUNDS = {"token_ratio": within(0, 1, below=True), "infilling_ratio": within(0, 1, below=True),
                "poisson_lambda": within(0.5, 1000)}


def make_noise(name: str, mask_id: int | None = None, sentence_end: int | None = None,
               token_ratio: float = 0.15, infilling_ratio: float = 0.3, poisson_lambda: float = 3.0):
    """The noise `name` with its parameters bound: a function (tokens, generator) -> tokens."""
    if name not in NOISES:
        raise ValueError(f"unknown noise {name!r}; noises are {', '.join(NOISES)}")
    if name in ("token-masking", "text-infilling") and mask_id is None:
        raise ValueError(f"noise {name!r} needs a mask token")
    if name == "sentence-permutation" and sentence_end is None:
        raise ValueError("noise 'sentence-permutation' needs the sentence-end token")
    ratios = dict(token_ratio=token_ratio, infilling_ratio=infilling_ratio, poisson_lambda=poisson_lambda)
    check_bounds(ratios, NOISE_BOUNDS)
    return {"token-masking": partial(token_masking, mask_id=mask_id, p=token_ratio),
            "token-deletion": partial(token_deletion, p=token_ratio),
            "text-infilling": partial(text_infilling, mask_id=mask_id, p=infilling_ratio,
                                      poisson_lambda=poisson_lambda),
            "sentence-permutation": partial(sentence_permutation, sentence_end=sentence_end),
            "document-rotation": document_rotation}[name]


class Denoising(Seq2SeqLM):
    """BART's pretraining: reconstruct <s> text </s> from its noised version."""

    name = "denoising"
    bounds = {**Seq2SeqLM.bounds, **NOISE_BOUNDS, "noises": (  # a callable: a noise of the caller's own
        (lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and
         all(callable(n) or n in NOISES for n in v)),
        f"a list of at least one of {', '.join(NOISES)}")}

    def __init__(self, model, mask_id: int | None, noises=("sentence-permutation", "text-infilling"),
                 sentence_end: int | None = None, ends: tuple = (None, None), pad_id: int = 0,
                 decoder_start_id: int | None = None, token_ratio: float = 0.15, infilling_ratio: float = 0.3,
                 poisson_lambda: float = 3.0) -> None:
        """ends: the (<s>, </s>) ids the noise leaves in place (None: no such end)."""
        super().__init__(model, pad_id, decoder_start_id)
        self.check_values({"noises": noises})
        ratios = dict(token_ratio=token_ratio, infilling_ratio=infilling_ratio, poisson_lambda=poisson_lambda)
        # names are built with this objective's tokens; a callable is taken as it is (composition)
        self.noises = [n if callable(n) else make_noise(n, mask_id, sentence_end, **ratios) for n in noises]
        self.bos_id, self.eos_id = ends

    @classmethod
    def build(cls, model, tokenizer, **options) -> Denoising:
        """BART's objective around `model`, with the tokenizer's mask, <s>, </s> and pad (the start: the
        config). Sentence permutation splits after each "." (what the corpus reader splits on, mostly)."""
        eos, end = tokenizer.special_id("eos"), tokenizer.token_to_id(".")
        return cls(model, tokenizer_mask(tokenizer, cls.__name__), sentence_end=end,
                   ends=(tokenizer.special_id("bos"), eos), pad_id=tokenizer_pad(tokenizer), **options)

    def noise(self, tokens: list, generator: torch.Generator) -> list:
        """Every noise in turn over tokens (no <s>/</s>)."""
        for noise in self.noises:
            tokens = noise(tokens, generator)
        return tokens

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """input_ids = <s> noised text </s> (the ends stay in place), labels = the original."""
        ids = list(example["input_ids"])
        head = 1 if self.bos_id is not None and ids[:1] == [self.bos_id] else 0
        tail = 1 if self.eos_id is not None and len(ids) > head and ids[-1] == self.eos_id else 0
        body = self.noise(ids[head: len(ids) - tail], generator)
        return {"input_ids": ids[:head] + body + ids[len(ids) - tail:], "labels": ids}


# <s> the sentences of one document </s> (DOC-SENTENCES); GPT-2's byte-level BPE with RoBERTa's tokens
register(ObjectiveSpec(name="denoising", build=Denoising.build, summary="denoising autoencoder (BART)",
                       aliases=("bart",), architectures=("encoder-decoder",), tokenizer="roberta",
                       examples=ExampleFormat("sentences", roles=("bos", "eos"), cross_documents=False)))
