"""RoBERTa (Liu et al. 2019) in the reference library's layout: model_type "roberta".

The backbone's tensors are named as BERT's. Learned positions start at padding_idx + 1,
so ModelConfig.position_offset = pad_token_id + 1 and the reference's table has
max_seq_len + position_offset rows.

Positions: the reference derives them from the input ids (fairseq's make_positions): a
padding token gets position padding_idx and every other token the running count of
non-padding tokens before it. lmforge numbers positions 0, 1, 2, ... as given. For
right-padded batches whose padding is the pad token, the real tokens' positions agree
(padded positions differ, and are masked out). A pad id inside a sequence, or left
padding, numbers real tokens differently: pass position_ids = cumsum(mask) - 1 there.
"""
from __future__ import annotations

from typing import Callable

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert import bert
from lmforge.convert.encoders import encoder_fields, reference_fields
from lmforge.convert.family import Family, n_labels, tied_by_weights
from lmforge.convert.keymap import Rule, linear
from lmforge.presets import ROBERTA


def config(hf: dict) -> ModelConfig:
    """RobertaConfig fields -> ModelConfig."""
    fields = encoder_fields(hf)
    pad = hf.get("pad_token_id", 1)
    if pad is None or pad < 0:
        raise ConfigError("RoBERTa needs pad_token_id >= 0: its positions start at pad_token_id + 1",
                          "pad_token_id")
    offset = pad + 1
    if hf["max_position_embeddings"] <= offset:
        raise ConfigError(f"max_position_embeddings={hf['max_position_embeddings']} leaves no position "
                          f"after the first pad_token_id + 1 = {offset} rows", "max_position_embeddings")
    # the LM head's transform applies gelu whatever hidden_act says
    return ModelConfig.from_dict({**ROBERTA, **fields, "pad_token_id": pad, "position_offset": offset,
                                  "position_from_padding": True,
                                  "max_seq_len": hf["max_position_embeddings"] - offset,
                                  "lm_activation": "gelu"})


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> RobertaConfig fields."""
    if cfg.position != "learned" or cfg.position_offset < 1:
        raise ConfigError("RoBERTa needs learned positions with position_offset >= 1 (= pad_token_id + 1)",
                          "position" if cfg.position != "learned" else "position_offset")
    pad = cfg.position_offset - 1
    if cfg.pad_token_id not in (None, pad):
        raise ConfigError(f"RoBERTa's pad_token_id must be position_offset - 1 = {pad}, not "
                          f"{cfg.pad_token_id}", "pad_token_id")
    return dict(reference_fields(cfg), pad_token_id=pad, max_position_embeddings=cfg.max_seq_len + pad + 1)


def head_rules(name: str, kind: str, cfg: ModelConfig) -> list:
    """Where each head's tensors live in a RoBERTa checkpoint."""
    h = f"heads.{name}"
    if kind == "lm":
        rules = [*linear(f"{h}.transform", "lm_head.dense"), *linear(f"{h}.norm", "lm_head.layer_norm"),
                 Rule(f"{h}.bias", ("lm_head.bias",))]
        if not cfg.tie_embeddings:
            # untied, the reference ties nothing: the decoder's own bias is the one applied (the
            # later rule wins on import); export writes ours to both
            rules += [Rule(f"{h}.decoder.weight", ("lm_head.decoder.weight",)),
                      Rule(f"{h}.bias", ("lm_head.decoder.bias",), "clone")]
        return rules
    if kind == "pooler":
        return linear(f"{h}.dense", "pooler.dense")
    if kind == "classification":  # dense + tanh + out_proj on <s>: the pooler and classifier
        return [*linear(f"{h}.pooler.dense", "classifier.dense"),
                *linear(f"{h}.classifier", "classifier.out_proj")]
    if kind == "token-classification":
        return linear(f"{h}.classifier", "classifier")
    if kind == "span-qa":
        return linear(f"{h}.qa", "qa_outputs")
    raise ConfigError(f"head kind {kind!r} has no RoBERTa checkpoint layout", "kind")


def _labelled(kind: str) -> Callable:
    return lambda hf: [(kind, kind, {"n_labels": n_labels(hf)})]


FAMILY = Family(
    model_types=("roberta",),
    prefix="roberta.",
    config=config,
    backbone=bert.backbone,  # the same tensor names as BERT's
    heads={
        "RobertaModel": lambda hf: [("pooler", "pooler", {})],
        "RobertaForMaskedLM": lambda hf: [("lm", "lm", {})],
        "RobertaForSequenceClassification": _labelled("classification"),
        "RobertaForTokenClassification": _labelled("token-classification"),
        "RobertaForQuestionAnswering": lambda hf: [("span-qa", "span-qa", {})],
    },
    head_rules=head_rules,
    to_reference=to_reference,
    bare=("RobertaModel",),
    head_keys=r"(lm_head|classifier|qa_outputs)\..*",
    # position_ids buffers of old checkpoints; the tied decoder copies of the token table / bias
    ignore=(r"(.*\.)?position_ids", r"lm_head\.decoder\.(weight|bias)"),
    refine=tied_by_weights("embeddings.word_embeddings.weight", "lm_head.decoder.weight",
                           ("lm_head.bias", "lm_head.decoder.bias")),
)
