"""DistilBERT's triple loss (Sanh et al. 2019, sec. 2-3): a student learns from a frozen teacher.

    L = alpha * L_ce + beta * L_mlm + gamma * L_cos

- L_ce, the distillation loss (Hinton et al. 2015): the teacher's soft targets at
  temperature T, T^2 x KL(softmax(z_t / T) || softmax(z_s / T)) averaged over positions. It
  differs from the paper's cross-entropy sum_i t_i log s_i by the teacher's entropy, a
  constant: the same gradients, and 0 when the student matches. The reference code
  (transformers' examples/research_projects/distillation, distiller.py) uses this KL with
  "batchmean" and T^2, over every real position unless --restrict_ce_to_mask: `soft_on`.
- L_mlm: the student's masked-LM loss at the masked positions (BERT's 15 %, 80/10/10).
- L_cos: 1 - cos(h_s, h_t) between the last hidden states, averaged over real positions.

Defaults are the reference README's training command (--alpha_ce 5.0 --alpha_mlm 2.0
--alpha_cos 1.0) and train.py's --temperature 2.0. The student starts from the teacher
(sec. 3, "taking one layer out of two"): `student_from_teacher`. Not reproduced: the
reference's frequency-smoothed choice of masked tokens (--mlm_smoothing 0.7), its frozen
position table (--freeze_pos_embs), and DistilBERT's removal of the segment table and the
pooler (the student keeps the teacher's config but for its depth).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.data.stream import ExampleFormat
from lmforge.heads import make_head
from lmforge.model import from_config
from lmforge.objectives.base import (IGNORE, LOSS_WEIGHT, TEMPERATURE, Loss, one_of, tokenizer_pad,
                                     tokenizer_specials)
from lmforge.objectives.mlm import MaskedLM
from lmforge.objectives.registry import ObjectiveSpec, register
from lmforge.quant.int8 import refuse_int8
from lmforge.utils.checksum import model_fingerprint
from lmforge.utils.errors import OptionsError

SOFT_ON = ("real", "masked")  # positions of L_ce: every real token (reference default) or the masked ones
# scripts/extract_distilbert.py's choice for a 12-layer BERT: every other layer, keeping the first and last
DISTILBERT_LAYERS = (0, 2, 4, 7, 9, 11)
_BLOCK = re.compile(r"^(encoder|decoder)\.blocks\.(\d+)\.")


def every_other(n_layers: int) -> tuple:
    """Teacher layers 0, 2, 4, ...: one out of two, n_layers // 2 of them (student block k <- teacher 2k); a
    ValueError for a teacher of one layer (no other one to copy)."""
    if n_layers < 2:
        raise ValueError(f"a student of every other teacher layer needs a teacher of 2 layers or more, this "
                         f"one has {n_layers}: choose the layers the student copies, or a preset student")
    return tuple(range(0, 2 * (n_layers // 2), 2))


def _teacher_key(key: str, layers: tuple) -> str:
    match = _BLOCK.match(key)
    if match is None:  # embeddings, final norm, position biases, heads: the same name
        return key
    return f"{match.group(1)}.blocks.{layers[int(match.group(2))]}.{key[match.end():]}"


def refuse_int8_teacher(teacher: nn.Module) -> None:
    """A ValueError where the teacher is int8-quantised: its float weights, which a student copies and
    its soft targets come from, are gone (give the fp32 model it was quantised from)."""
    refuse_int8(teacher, "distil from the fp32 model it was quantised from", what="the teacher")


def layer_fields(cfg, layers: Sequence[int]) -> dict:
    """The per-layer config fields of a student of `layers` (student layer k <- teacher layer layers[k]):
    schedules, and what structural pruning left (ffn_sizes, pruned_heads: keys "stack.L") re-indexed."""
    changes: dict = {}
    for field in ("attention_schedule", "window_schedule"):  # a list, an entry per layer
        if getattr(cfg, field):
            changes[field] = [getattr(cfg, field)[i] for i in layers]
    stack = cfg.architecture  # an encoder or a decoder: one stack, keys "encoder.L" or "decoder.L"
    for field in ("ffn_sizes", "pruned_heads"):
        found = getattr(cfg, field) or {}
        if found:
            kept = {f"{stack}.{k}": found[f"{stack}.{i}"] for k, i in enumerate(layers)
                    if f"{stack}.{i}" in found}
            changes[field] = kept or None
    return changes


def check_copyable(cfg) -> None:
    """A ValueError where a student cannot copy the blocks of a teacher of config `cfg`: an encoder-decoder,
    or one block shared by every layer (ALBERT). student_from_teacher's rule, which refuse_teacher also puts
    to a teacher folder's config before its weights are read."""
    if cfg.architecture == "encoder-decoder" or cfg.share_layers:
        raise ValueError("student_from_teacher takes an encoder or decoder with one block per layer")


def teacher_config(path):
    """The ModelConfig of model folder `path` from its config.json alone, no weight read (lmforge.io's
    folder_config, as lmforge.load reads it); None where it reads as neither: the loader says why."""
    from lmforge.io import folder_config

    try:
        return folder_config(path)
    except (ValueError, TypeError, AttributeError, KeyError):  # CheckpointError among them: load names it
        return None


def refuse_teacher(where: str, cfg, *rules) -> None:
    """Each rule (cfg -> None, or a ValueError saying why not) on a teacher's config `cfg` (None: none read,
    nothing checked); a refusal is an OptionsError naming teacher, "{where}: {why}", one line."""
    for rule in rules if cfg is not None else ():
        try:
            rule(cfg)
        except ValueError as err:
            raise OptionsError(f"{where}: {err}", "teacher") from None


def student_from_teacher(teacher: nn.Module, layers: Optional[Sequence[int]] = None) -> nn.Module:
    """A student of the teacher's width whose block k copies teacher block layers[k] (default
    `every_other`: block k <- block 2k); embeddings, final norm and heads are copied too."""
    cfg = teacher.config
    refuse_int8_teacher(teacher)
    check_copyable(cfg)
    layers = tuple(every_other(cfg.n_layers) if layers is None else layers)
    if not layers or not all(0 <= i < cfg.n_layers for i in layers):
        raise ValueError(f"layers {layers} must be a non-empty choice among the teacher's {cfg.n_layers}")
    student = from_config(cfg.replace(n_layers=len(layers), **layer_fields(cfg, layers)), init=False)
    for name, head in teacher.heads.items():
        spec = dict(head.spec)
        student.add_head(name, make_head(student, spec.pop("kind"), **spec))
    source = teacher.state_dict()
    student.load_state_dict({key: source[_teacher_key(key, layers)] for key in student.state_dict()})
    return student


def soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                       temperature: float) -> torch.Tensor:
    """T^2 x mean over rows of KL(softmax(teacher / T) || softmax(student / T)), logits (N, V); 0 (still
    attached to the graph) for no rows, never NaN (soft_on="masked" on a batch where nothing is masked)."""
    if student_logits.shape[0] == 0:  # "batchmean" divides by N
        return student_logits.float().sum() * 0.0
    log_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    return F.kl_div(log_s, log_t, reduction="batchmean", log_target=True) * temperature ** 2


def cosine_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor) -> torch.Tensor:
    """Mean of 1 - cos(h_s, h_t) over rows (N, d): aligns the directions of the hidden states."""
    return (1 - F.cosine_similarity(student_hidden.float(), teacher_hidden.float(), dim=-1)).mean()


def _hidden(model: nn.Module, batch: dict) -> torch.Tensor:
    """Last hidden states (B, T, d) without the heads: the vocabulary projection runs only on
    the positions the loss needs."""
    return model(batch["input_ids"], batch["attention_mask"], segment_ids=batch.get("segment_ids"),
                 run_heads=False).last_hidden_state


def check_teacher_vocabulary(teacher, tokenizer, field: str) -> None:
    """An OptionsError naming `field` (tokenizer: the one given; teacher: its folder's own; data: the shards'
    a model teacher is given with) where the run's tokenizer has other than the teacher's vocab_size ids: the
    student is grown from the teacher, embeddings and LM head as they are. Once the teacher is had and before
    the corpus is read (pretrain's teacher_model; Distillation.build checks it again for a caller that builds
    the objective itself)."""
    if tokenizer is None or tokenizer.vocab_size == teacher.config.vocab_size:
        return  # none yet (a model teacher, no tokenizer=, text: one trained on it, checked once trained)
    said = (f"the tokenizer given has {tokenizer.vocab_size} ids, the teacher's vocabulary "
            f"{teacher.config.vocab_size}: give the teacher's own tokenizer")
    if field == "teacher":
        said = (f"its folder's tokenizer has {tokenizer.vocab_size} ids, its vocabulary "
                f"{teacher.config.vocab_size}: give the one it was trained with (tokenizer=, --tokenizer)")
    if field == "data":
        said = (f"the shards' tokenizer has {tokenizer.vocab_size} ids, the teacher's vocabulary "
                f"{teacher.config.vocab_size}: shard the text with the teacher's tokenizer")
    raise OptionsError(f"{field}: {said}", field)


class Distillation(MaskedLM):
    """DistilBERT: masked LM for the student plus the teacher's soft targets and hidden directions."""

    name = "distillation"
    bounds = {**MaskedLM.bounds, "alpha": LOSS_WEIGHT, "beta": LOSS_WEIGHT, "gamma": LOSS_WEIGHT,
              "temperature": TEMPERATURE, "soft_on": one_of(SOFT_ON)}

    def __init__(self, student, teacher, mask_id: int, alpha: float = 5.0, beta: float = 2.0,
                 gamma: float = 1.0, temperature: float = 2.0, soft_on: str = "real", **mlm) -> None:
        super().__init__(student, mask_id, **mlm)
        refuse_int8_teacher(teacher)
        if student.config.architecture != "encoder" or teacher.config.architecture != "encoder":
            raise ValueError("masked-LM distillation needs an encoder teacher and student")
        if "lm" not in teacher.heads:
            raise ValueError("the teacher needs its masked-LM head ('lm') for the soft targets")
        if teacher.config.vocab_size != student.config.vocab_size:
            raise ValueError("teacher and student must share the vocabulary")
        if gamma and teacher.config.d_model != student.config.d_model:
            raise ValueError("the cosine loss compares hidden states: same d_model, or gamma=0")
        self.check_values(dict(alpha=alpha, beta=beta, gamma=gamma, temperature=temperature, soft_on=soft_on))
        self.teacher = teacher.requires_grad_(False).eval()
        self.alpha, self.beta, self.gamma, self.temperature, self.soft_on = (alpha, beta, gamma, temperature,
                                                                             soft_on)

    @classmethod
    def build(cls, teacher, tokenizer, **options) -> Distillation:
        """DistilBERT: a student of every other `teacher` layer, trained against the teacher."""
        check_teacher_vocabulary(teacher, tokenizer, "tokenizer")
        return cls(student_from_teacher(teacher), teacher, tokenizer.special_id("mask"),
                   special_ids=tokenizer_specials(tokenizer, ("cls", "sep", "pad")),
                   pad_id=tokenizer_pad(tokenizer), **options)

    def run_settings(self) -> dict:
        """The teacher (its fingerprint): recorded in the Trainer's checkpoints, so a resume with another
        teacher of the same shape is refused, not continued with the run's teacher that they carry."""
        return {"teacher": model_fingerprint(self.teacher)}

    def train(self, mode: bool = True) -> Distillation:
        """Train the student; the teacher stays in eval mode (no dropout) whatever the mode."""
        super().train(mode)
        self.teacher.eval()
        return self

    def forward(self, batch: dict) -> Loss:
        """alpha L_ce + beta L_mlm + gamma L_cos on one padded batch; the teacher sees the same input."""
        real, labels = batch["attention_mask"].bool(), batch["labels"]
        soft = real if self.soft_on == "real" else labels != IGNORE  # (B, T): where L_ce is taken
        with torch.no_grad():
            t_hidden = _hidden(self.teacher, batch)
            t_logits = self.teacher.heads["lm"](t_hidden[soft])  # (N, V)
        s_hidden = _hidden(self.model, batch)
        s_logits = self.lm(s_hidden[soft])  # (N, V); the masked positions are among them
        target = labels[soft]
        masked = target != IGNORE
        l_ce = soft_cross_entropy(s_logits, t_logits, self.temperature)
        l_mlm = F.cross_entropy(s_logits[masked].float(), target[masked]) if masked.any() else l_ce * 0.0
        l_cos = (cosine_loss(s_hidden[real], t_hidden[real]) if self.gamma
                 else torch.zeros((), device=l_ce.device))
        accuracy = ((s_logits[masked].argmax(-1) == target[masked]).float().mean() if masked.any()
                    else torch.zeros(()))
        metrics = {"ce_loss": l_ce.detach(), "mlm_loss": l_mlm.detach(), "cos_loss": l_cos.detach(),
                   "mlm_accuracy": accuracy.detach()}
        return Loss(self.alpha * l_ce + self.beta * l_mlm + self.gamma * l_cos, metrics)


register(ObjectiveSpec(name="distillation", build=Distillation.build,
                       summary="masked-LM distillation (DistilBERT)", aliases=("distilbert",),
                       architectures=("encoder",), tokenizer="bert", examples=ExampleFormat("sentences"),
                       teacher=True))
