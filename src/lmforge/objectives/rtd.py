"""ELECTRA's replaced-token detection (Clark et al. 2020, sec. 2, eq. 1-2 and sec. 3.2).

A small generator G, trained as a masked LM, fills the masked positions with tokens
sampled from its softmax; the discriminator D (the model kept) predicts for every real
position whether its token is the original or a replacement:

    min  L_MLM(x, theta_G) + lambda * L_Disc(x, theta_D),   lambda = 50 (Table 6).

A sampled token equal to the original counts as original (label 0); [MASK] is never sampled
(an untrained generator would draw it about 1/V of the time), so the discriminator never sees
it, as fine-tuning never shows it. No gradient flows
through the sampling, so G learns from its MLM loss only; the two meet in the embeddings
they share. The generator is the discriminator's config with d_model, d_ff and n_heads
scaled by `ratio` (scaling the heads keeps the head width, as the official code's
n_heads = d_model / 64 does) at the same depth and the same embedding width E. The ratio is
the discriminator config's `generator_size`, which the ELECTRA presets set as released
(google/electra-*-generator: 1 small, i.e. ELECTRA-Small++, 1/3 base, 1/4 large; Table 6 of
the paper has 1/4 for its small model), else 1/4 (the official code's default).

Corruption follows the official code (pretrain_helpers.mask), not BERT: of the 15 %
selected, 85 % become [MASK] and 15 % stay unchanged; there are no random replacements.
The paper's text describes [MASK] only; the generator's samples are ELECTRA's replacements.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import ModelConfig
from lmforge.data.stream import ExampleFormat
from lmforge.heads import make_head
from lmforge.model import from_config
from lmforge.objectives.base import (IGNORE, LOSS_WEIGHT, TEMPERATURE, Loss, Objective, check_bounds,
                                     tokenizer_mask, tokenizer_pad, tokenizer_specials, top1_accuracy, within)
from lmforge.objectives.mlm import REPLACE, MaskedLM
from lmforge.objectives.registry import ObjectiveSpec, register

MASKING = (0.85, 0.0, 0.15)  # [MASK] / random / unchanged, official pretrain_helpers.mask
GENERATOR_SIZE = 0.25  # without a generator_size in the config: configure_pretraining.py's default
RATIO = within(0, 1, above=True)  # the generator's width over the discriminator's
SHARED = ("segments", "positions", "norm")  # the E-wide parts of Embeddings, besides the token table


def generator_config(cfg: ModelConfig, ratio: float | None = None) -> ModelConfig:
    """The generator's config: d_model, d_ff and n_heads x ratio (default: cfg.generator_size, else 1/4),
    same depth, same embedding width E, and an LM head that projects d_model to E before the tied table."""
    ratio = ratio if ratio is not None else cfg.generator_size or GENERATOR_SIZE
    check_bounds({"ratio": ratio}, {"ratio": RATIO})  # FLOP counting calls this too, with an arm's ratio
    d_model = max(1, round(cfg.d_model * ratio))
    changes = dict(d_model=d_model, d_ff=max(1, round(cfg.d_ff * ratio)),
                   n_heads=max(1, round(cfg.n_heads * ratio)),
                   d_embed=cfg.embed_dim if cfg.embed_dim != d_model else None)
    if cfg.n_kv_heads is not None:
        changes["n_kv_heads"] = max(1, round(cfg.n_kv_heads * ratio))
    if cfg.tie_embeddings and not cfg.lm_transform and d_model != cfg.embed_dim:
        # a head without BERT's transform (XLNet's) reads d_model straight into the E-wide shared table: the
        # narrower generator gets ELECTRA's generator head instead (dense d_model -> E, activation, norm)
        changes["lm_transform"] = True
    return cfg.replace(**changes)


def _shapes(module: nn.Module) -> dict:
    return {k: (type(module), tuple(v.shape)) for k, v in module.state_dict().items()}


def share_embeddings(generator: nn.Module, discriminator: nn.Module) -> list:
    """Give the generator the discriminator's token table and, where shapes agree, its segment and
    position tables and embedding norm (sec. 3.2: sharing the embeddings); returns what is shared.

    Each model keeps its own E -> d_model projection, the only part whose shape differs."""
    if generator.tokens.weight.shape != discriminator.tokens.weight.shape:
        raise ValueError(f"the generator's token table {tuple(generator.tokens.weight.shape)} differs from "
                         f"the discriminator's {tuple(discriminator.tokens.weight.shape)}: set d_embed and "
                         "vocab_size alike")
    generator.tokens = discriminator.tokens
    shared = ["tokens"]
    for name in SHARED:
        mine, theirs = getattr(generator.embed, name), getattr(discriminator.embed, name)
        if mine is not None and theirs is not None and _shapes(mine) == _shapes(theirs):
            setattr(generator.embed, name, theirs)
            shared.append(f"embed.{name}")
    return shared


@torch.no_grad()
def sample(logits: torch.Tensor, temperature: float = 1.0, never: int | None = None) -> torch.Tensor:
    """One token per row of logits (N, V) from softmax(logits / temperature), never the id `never`;
    no gradient (sec. 2)."""
    if logits.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=logits.device)
    scores = logits.float() / temperature
    if never is not None:  # the [MASK] id: a generator's sample of it would show [MASK] to the discriminator
        scores[:, never] = float("-inf")
    return torch.multinomial(F.softmax(scores, dim=-1), 1).squeeze(-1)


def replace_tokens(input_ids: torch.Tensor, labels: torch.Tensor, sampled: torch.Tensor) -> tuple:
    """x^corrupt (B, T): the original text with the samples at the masked positions, and the
    discriminator's labels (B, T): 1 exactly where the token differs from the original."""
    selected = labels != IGNORE
    original = torch.where(selected, labels, input_ids)  # undo [MASK] (and any kept token)
    corrupted = original.clone()
    corrupted[selected] = sampled
    return corrupted, (corrupted != original).long()


def generator_step(generator: MaskedLM, batch: dict) -> tuple:
    """The generator's MLM loss, its logits at the selected positions (N, V) and its top-1 accuracy."""
    selected = batch["labels"] != IGNORE
    hidden = generator.model(batch["input_ids"], batch["attention_mask"],
                             segment_ids=batch.get("segment_ids"), run_heads=False).last_hidden_state
    logits = generator.lm(hidden[selected]).float()  # (N, V): the selected positions only
    target = batch["labels"][selected]
    mlm = F.cross_entropy(logits, target) if target.numel() else logits.sum() * 0.0
    return mlm, logits, top1_accuracy(logits, target)


class ReplacedTokenDetection(Objective):
    """ELECTRA: a generator masked LM and the discriminator it trains, sharing their embeddings.

    `model` is the discriminator; the generator is built from `generator` (a ModelConfig) or,
    without one, from `generator_config(model.config, ratio)` (ratio None: the config's
    generator_size, else 1/4), and kept as `self.generator`; `mlm` (rate, whole_word, special_ids) goes to
    the generator's MaskedLM with ELECTRA's `replace`, the masking both networks train on."""

    name = "rtd"
    all_used = True  # both losses on every batch (the generator's head on no rows where nothing is masked)
    bounds = {**MaskedLM.bounds, "ratio": RATIO, "replace": REPLACE, "disc_weight": LOSS_WEIGHT,
              "gen_weight": LOSS_WEIGHT, "temperature": TEMPERATURE,  # T: the generator's sampling
              "generator": ((lambda g: g is None or isinstance(g, ModelConfig)), "a ModelConfig")}

    def __init__(self, model, mask_id: int, ratio: float | None = None, generator: ModelConfig | None = None,
                 replace: tuple = MASKING, disc_weight: float = 50.0, gen_weight: float = 1.0,
                 temperature: float = 1.0, pad_id: int = 0, **mlm) -> None:
        super().__init__(model, pad_id)
        if model.config.architecture != "encoder":
            raise ValueError(f"replaced-token detection trains an encoder, not a {model.config.architecture}")
        self.check_values(dict(generator=generator, disc_weight=disc_weight, gen_weight=gen_weight,
                               temperature=temperature))
        G = from_config(generator or generator_config(model.config, ratio))
        self.shared = share_embeddings(G, model)
        # the generator's masked LM (its tied LM head is built after sharing, so it ties to the shared table)
        self.generator = MaskedLM(G, mask_id, replace=replace, pad_id=pad_id, **mlm)
        self.rtd = model.heads["rtd"] if "rtd" in model.heads else make_head(model, "rtd")
        self.disc_weight, self.gen_weight, self.temperature = disc_weight, gen_weight, temperature

    @classmethod
    def build(cls, model, tokenizer, **options) -> ReplacedTokenDetection:
        """ELECTRA around the discriminator `model`, with the tokenizer's mask, pad and special ids."""
        return cls(model, tokenizer_mask(tokenizer, cls.__name__), special_ids=tokenizer_specials(tokenizer),
                   pad_id=tokenizer_pad(tokenizer), **options)

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """The generator's masked-LM input: 15 % selected, labels = the originals there."""
        return self.generator.corrupt(example, generator)

    def forward(self, batch: dict) -> Loss:
        """gen_weight x L_MLM + disc_weight x L_Disc, the BCE over every real position (eq. 1-2)."""
        mlm, logits, mlm_accuracy = generator_step(self.generator, batch)
        sampled = sample(logits, self.temperature, never=self.generator.mask_id)
        corrupted, replaced = replace_tokens(batch["input_ids"], batch["labels"], sampled)
        hidden = self.model(corrupted, batch["attention_mask"], segment_ids=batch.get("segment_ids"),
                            run_heads=False).last_hidden_state
        scores = self.rtd(hidden)  # (B, T): logit that the token was replaced
        real = batch["attention_mask"].bool()
        target = replaced[real].float()
        disc = F.binary_cross_entropy_with_logits(scores[real].float(), target)
        metrics = {"mlm_loss": mlm.detach(), "mlm_accuracy": mlm_accuracy.detach(),
                   "disc_loss": disc.detach(),
                   "disc_accuracy": ((scores[real] > 0).float() == target).float().mean().detach(),
                   "replaced": target.mean().detach()}
        return Loss(self.gen_weight * mlm + self.disc_weight * disc, metrics)

    def heads(self) -> dict:
        """The discriminator's head, saved with it (ElectraForPreTraining's layout)."""
        return {"rtd": self.rtd}

    def finish_generator(self) -> nn.Module:
        """The generator with its MLM head attached (ElectraForMaskedLM), should it be kept too."""
        return self.generator.finish()


register(ObjectiveSpec(name="rtd", build=ReplacedTokenDetection.build,
                       summary="replaced-token detection (ELECTRA)", aliases=("electra",),
                       architectures=("encoder",), tokenizer="bert", examples=ExampleFormat("sentences")))
