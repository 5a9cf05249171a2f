"""Longformer (Beltagy et al. 2020) in the reference library's layout: model_type "longformer".

RoBERTa's embeddings, tensor names and heads (roberta.py, position offset pad_token_id + 1)
with Longformer self-attention: `attention="longformer"` and `global_projections=True`.

Window: the reference's `attention_window` w (one int or one per layer) lets token i see
j with |i - j| <= w // 2 (its `one_sided_attn_window_size`), which is lmforge's `window` w
(`window_schedule` when the layers differ). The reference pads the sequence to a multiple
of w internally; the padding is masked, so outputs at real positions are unchanged.

Global attention: the reference's `global_attention_mask` is lmforge's
`forward(global_tokens=mask.bool())`. Global tokens see every token through query_global,
key_global and value_global (lmforge's fused `global_qkv`); every token sees them through
the local projections, which is what lmforge's longformer pattern and `_longformer_global`
compute. Without a mask the reference's defaults depend on the architecture: the
classification model makes <s> global (n_global_tokens=1 here), the question-answering
model the question tokens before the first </s> (input-dependent: lmforge's QA task passes them
as global_tokens; a direct forward call must too), every other model none (n_global_tokens=0).
Export therefore needs n_global_tokens to be the default of the architecture its heads select.
"""
from __future__ import annotations

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert import bert, roberta
from lmforge.convert.family import Family, n_labels
from lmforge.convert.keymap import Rule

CLASSIFIER = "LongformerForSequenceClassification"  # the architecture whose default global token is <s>


def _windows(hf: dict) -> list:
    """The per-layer attention_window list, checked as the reference checks it."""
    window = hf.get("attention_window", 512)
    windows = window if isinstance(window, list) else [window] * hf["num_hidden_layers"]
    if len(windows) != hf["num_hidden_layers"]:
        raise ConfigError(f"attention_window has {len(windows)} entries but num_hidden_layers="
                          f"{hf['num_hidden_layers']}", "attention_window")
    if any(not isinstance(w, int) or w < 2 or w % 2 for w in windows):
        raise ConfigError(f"attention_window={window!r} must be even positive integers", "attention_window")
    return windows


def config(hf: dict) -> ModelConfig:
    """LongformerConfig fields -> ModelConfig."""
    if hf.get("onnx_export"):
        raise ConfigError("onnx_export=true is not supported", "onnx_export")
    windows = _windows(hf)
    cfg = roberta.config(hf)
    if max(windows) > cfg.max_seq_len:
        raise ConfigError(f"attention_window={max(windows)} is larger than the {cfg.max_seq_len} positions "
                          f"of max_position_embeddings={hf['max_position_embeddings']}", "attention_window")
    architecture = (hf.get("architectures") or [None])[0]
    return cfg.replace(attention="longformer", window=max(windows),
                       window_schedule=windows if len(set(windows)) > 1 else None, global_projections=True,
                       n_global_tokens=1 if architecture == CLASSIFIER else 0)


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> LongformerConfig fields (`family_of` checks that they express `cfg` exactly)."""
    everywhere = set(cfg.layer_patterns()) == {"longformer"}
    if not everywhere or not cfg.global_projections:
        raise ConfigError("Longformer needs attention='longformer' in every layer with global_projections",
                          "global_projections" if everywhere else "attention")
    windows = [cfg.layer_window(i) for i in range(cfg.n_layers)]
    if any(w % 2 for w in windows):
        raise ConfigError(f"Longformer's windows must be even, got {windows}",
                          "window_schedule" if cfg.window_schedule else "window")
    reference = dict(roberta.to_reference(cfg), attention_window=windows)
    if cfg.n_global_tokens == 1:  # a hint for config(); save_hf writes the architecture of the heads
        reference["architectures"] = [CLASSIFIER]
    return reference


def backbone(cfg: ModelConfig) -> list:
    """RoBERTa's embeddings and layers, plus the global query, key and value of every layer."""
    layer = "encoder.layer.{i}.attention.self"
    qkv = [f"{layer}.{p}_global" for p in ("query", "key", "value")]
    return [*bert.backbone(cfg),
            Rule("encoder.blocks.{i}.attn.global_qkv.weight", tuple(f"{p}.weight" for p in qkv)),
            Rule("encoder.blocks.{i}.attn.global_qkv.bias", tuple(f"{p}.bias" for p in qkv))]


def _labelled(kind: str):
    return lambda hf: [(kind, kind, {"n_labels": n_labels(hf)})]


FAMILY = Family(
    model_types=("longformer",),
    prefix="longformer.",
    config=config,
    backbone=backbone,
    heads={
        "LongformerModel": lambda hf: [("pooler", "pooler", {})],
        "LongformerForMaskedLM": lambda hf: [("lm", "lm", {})],
        CLASSIFIER: _labelled("classification"),
        "LongformerForTokenClassification": _labelled("token-classification"),
        "LongformerForQuestionAnswering": lambda hf: [("span-qa", "span-qa", {})],
    },
    head_rules=roberta.head_rules,  # lm_head, classifier.dense/out_proj, classifier, qa_outputs
    to_reference=to_reference,
    bare=("LongformerModel",),
    head_keys=roberta.FAMILY.head_keys,
    ignore=roberta.FAMILY.ignore,
    refine=roberta.FAMILY.refine,
)
