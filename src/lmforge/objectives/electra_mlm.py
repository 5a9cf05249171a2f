"""ELECTRA's two masked-LM ablations (Clark et al. 2020, sec. 3.5, Table 5): Replace MLM and
All-Tokens MLM, the arms between BERT's MLM and replaced-token detection.

Both corrupt the input as ELECTRA does: a small generator G (rtd.generator_config, sharing the
embeddings) is trained as a masked LM and its samples replace the masked tokens, so the model
never sees [MASK]. Then

- Replace MLM: the model predicts the original token at the replaced positions only (an MLM
  loss over the ~15 % selected, as BERT, but on generator samples instead of [MASK]);
- All-Tokens MLM: the model predicts the identity of every token, with the paper's explicit copy
  mechanism: a sigmoid gate D(x_t) per position, and the output distribution
  p(x_t) = D 1[x_t = input_t] + (1 - D) softmax(LM(h_t)) (sec. 3.5).

The loss is gen_weight x L_MLM(G) + the model's loss. The LM head is the model's own (tied to the
shared token table), kept with the model; the copy gate stays with the objective.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.data.stream import ExampleFormat
from lmforge.heads import make_head
from lmforge.model import from_config
from lmforge.objectives.base import (IGNORE, LOSS_WEIGHT, TEMPERATURE, Loss, Objective, tokenizer_mask,
                                     tokenizer_pad, tokenizer_specials, top1_accuracy)
from lmforge.objectives.mlm import REPLACE, MaskedLM
from lmforge.objectives.registry import ObjectiveSpec, register
from lmforge.objectives.rtd import (MASKING, RATIO, generator_config, generator_step, replace_tokens, sample,
                                    share_embeddings)


def copy_log_likelihood(logits: torch.Tensor, gate: torch.Tensor, inputs: torch.Tensor,
                        target: torch.Tensor) -> torch.Tensor:
    """log p(target) under the copy mixture, per row: logits (N, V), gate logits (N,), the input
    tokens and the originals (N,). log(D [input = target] + (1 - D) softmax(logits)[target])."""
    log_soft = F.log_softmax(logits.float(), dim=-1).gather(-1, target[:, None]).squeeze(-1)  # (N,)
    log_keep, log_skip = F.logsigmoid(gate.float()), F.logsigmoid(-gate.float())  # log D, log (1 - D)
    generate = log_skip + log_soft
    copied = torch.logaddexp(log_keep, generate)  # the input is the target: both terms add
    return torch.where(inputs == target, copied, generate)


class ElectraMLM(Objective):
    """Replace MLM (all_tokens=False) or All-Tokens MLM (all_tokens=True) with ELECTRA's generator."""

    name = "replace-mlm"
    bounds = {**MaskedLM.bounds, "ratio": RATIO, "replace": REPLACE, "gen_weight": LOSS_WEIGHT,
              "temperature": TEMPERATURE}  # T: the generator's sampling

    def __init__(self, model, mask_id: int, all_tokens: bool = False, ratio: float | None = None,
                 replace: tuple = MASKING, gen_weight: float = 1.0, temperature: float = 1.0, pad_id: int = 0,
                 **mlm) -> None:
        super().__init__(model, pad_id)
        if model.config.architecture != "encoder":
            raise ValueError(f"{type(self).__name__} trains an encoder, not a {model.config.architecture}")
        self.check_values(dict(gen_weight=gen_weight, temperature=temperature))
        G = from_config(generator_config(model.config, ratio))
        self.shared = share_embeddings(G, model)
        # mlm: rate, whole_word, special_ids
        self.generator = MaskedLM(G, mask_id, replace=replace, pad_id=pad_id, **mlm)
        self.lm = model.heads["lm"] if "lm" in model.heads else make_head(model, "lm")
        self.all_tokens, self.gen_weight, self.temperature = all_tokens, gen_weight, temperature
        self.name = "all-tokens-mlm" if all_tokens else "replace-mlm"
        self.copy = nn.Linear(model.config.d_model, 1) if all_tokens else None  # D(x_t) of sec. 3.5
        # Replace MLM skips the model's head and loss on a batch with nothing masked; every real token is
        # a row of All-Tokens MLM's
        self.all_used = all_tokens

    @classmethod
    def build(cls, model, tokenizer, **options) -> ElectraMLM:
        """The objective around `model`, with the tokenizer's mask, pad and special ids."""
        return cls(model, tokenizer_mask(tokenizer, cls.__name__), special_ids=tokenizer_specials(tokenizer),
                   pad_id=tokenizer_pad(tokenizer), **options)

    def corrupt(self, example: dict, generator: torch.Generator) -> dict:
        """The generator's masked-LM input: 15 % selected, labels = the originals there."""
        return self.generator.corrupt(example, generator)

    def forward(self, batch: dict) -> Loss:
        """gen_weight x the generator's MLM loss + the model's MLM loss on the corrupted text."""
        gen_mlm, gen_logits, _ = generator_step(self.generator, batch)
        sampled = sample(gen_logits, self.temperature, never=self.generator.mask_id)
        corrupted, _ = replace_tokens(batch["input_ids"], batch["labels"], sampled)
        original = torch.where(batch["labels"] != IGNORE, batch["labels"], batch["input_ids"])
        hidden = self.model(corrupted, batch["attention_mask"], segment_ids=batch.get("segment_ids"),
                            run_heads=False).last_hidden_state  # (B, T, d)
        rows = batch["attention_mask"].bool() if self.all_tokens else batch["labels"] != IGNORE
        logits, target = self.lm(hidden[rows]), original[rows]  # (N, V), (N,)
        if not target.numel():
            loss = hidden.sum() * 0.0
        elif self.all_tokens:
            gate = self.copy(hidden[rows]).squeeze(-1)  # (N,)
            loss = -copy_log_likelihood(logits, gate, corrupted[rows], target).mean()
        else:
            loss = F.cross_entropy(logits.float(), target)
        metrics = {"gen_mlm_loss": gen_mlm.detach(), "mlm_loss": loss.detach(),
                   "mlm_accuracy": top1_accuracy(logits, target)}
        return Loss(self.gen_weight * gen_mlm + loss, metrics)

    def heads(self) -> dict:
        """The model's MLM head, saved with it."""
        return {"lm": self.lm}


register(ObjectiveSpec(name="replace-mlm", build=ElectraMLM.build,
                       summary="MLM on generator replacements (ELECTRA ablation)",
                       architectures=("encoder",), tokenizer="bert", examples=ExampleFormat("sentences")))
register(ObjectiveSpec(name="all-tokens-mlm", build=ElectraMLM.build,
                       summary="MLM of every token with a copy gate (ELECTRA ablation)",
                       architectures=("encoder",), tokenizer="bert", examples=ExampleFormat("sentences"),
                       options={"all_tokens": True}))
