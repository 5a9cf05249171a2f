"""BigBird (Zaheer et al. 2020) in the reference library's layout: model_type "big_bird".

BERT's tensor names (bert.py) with BigBird's attention and heads. Both reference
attention types load as lmforge's `attention="bigbird"` (block_size b, n_random_blocks r),
which equals the reference in eval mode at every length:

* "block_sparse" pads the sequence to a multiple of b; query block 0 and the last block see
  every key; the others see their 3-block window, the first and last blocks and r random
  blocks. At inference the reference draws no random blocks: every one of the r picks is
  block 0, so the first block's keys enter the softmax 1 + r times (lmforge's
  `random_block_choice="first"`, a log(1 + r) score bias). Sequences of at most
  (5 + 2r) * b tokens switch the reference to full attention (`dense_max_len`); note that
  the reference then stays switched for the model's later calls.
* "original_full" is full attention: `dense_max_len = max_seq_len`. Its blocks are never used,
  so a block size too large for the length (the default 64 with 128 positions) is shrunk to
  fit lmforge's 3-block minimum; an export writes that block size back, which the reference's
  full attention ignores as well.

In training mode the reference draws random blocks per head and per call; lmforge does not
reproduce those draws. The classification head applies hidden_act, not tanh, to its dense
layer (`pooler_activation`); the masked-LM, classification and token-classification
checkpoints keep an unused pooler, carried here as a "pooler" head so a round trip is
lossless. The question-answering head runs one more feed-forward sub-layer (SpanQAHead
ffn=True). Its reference also subtracts 1e6 from the logits of the question tokens up to the
first sep token and, given no token_type_ids, makes the tokens after it segment 1; lmforge's
head sees no token ids: its QA task does both (the tokenizer's segments, the question masked),
a direct forward call must pass segment_ids and ignore the question positions.
"""
from __future__ import annotations

from typing import Callable

from lmforge.config import ConfigError, ModelConfig
from lmforge.convert import bert
from lmforge.convert.encoders import encoder_fields, reference_fields
from lmforge.convert.family import Family, n_labels, tied_by_weights
from lmforge.convert.keymap import Rule, linear
from lmforge.presets import BERT

CLASSIFIER = "BigBirdForSequenceClassification"  # its head's dense layer uses hidden_act


def sparse_max_dense(block_size: int, n_random_blocks: int, max_seq_len: int) -> int:
    """Longest sequence the reference's block_sparse attention still computes densely."""
    return min((5 + 2 * n_random_blocks) * block_size, max_seq_len)


def config(hf: dict) -> ModelConfig:
    """BigBirdConfig fields -> ModelConfig."""
    fields = encoder_fields(hf, act="gelu_new")
    if not hf.get("use_bias", True):  # lmforge's attention_bias=False also drops the output bias
        raise ConfigError("use_bias=false is not supported", "use_bias")
    kind = hf.get("attention_type", "block_sparse")
    if kind not in ("block_sparse", "original_full"):
        raise ConfigError(f"attention_type={kind!r} is not one of block_sparse, original_full",
                          "attention_type")
    b, r, length = hf.get("block_size", 64), hf.get("num_random_blocks", 3), hf["max_position_embeddings"]
    if kind == "original_full":  # never uses its blocks: any block size that fits the length will do
        b = min(b, max(1, length // 3))
    architecture = (hf.get("architectures") or [None])[0]
    return ModelConfig.from_dict({
        **BERT, **fields, "max_seq_len": length, "scale_embeddings": hf.get("rescale_embeddings", False),
        "attention": "bigbird", "block_size": b, "n_random_blocks": r, "random_block_choice": "first",
        "dense_max_len": sparse_max_dense(b, r, length) if kind == "block_sparse" else length,
        "pooler_activation": fields["ffn"] if architecture == CLASSIFIER else "tanh"})


def to_reference(cfg: ModelConfig) -> dict:
    """ModelConfig -> BigBirdConfig fields (`family_of` checks that they express `cfg` exactly)."""
    everywhere = set(cfg.layer_patterns()) == {"bigbird"}
    if not everywhere or cfg.random_block_choice != "first":
        raise ConfigError("BigBird needs attention='bigbird' in every layer with random_block_choice='first'",
                          "random_block_choice" if everywhere else "attention")
    sparse = sparse_max_dense(cfg.block_size, cfg.n_random_blocks, cfg.max_seq_len)
    if cfg.dense_max_len not in (sparse, cfg.max_seq_len):
        raise ConfigError(f"BigBird's dense_max_len is {sparse} (block_sparse) or max_seq_len="
                          f"{cfg.max_seq_len} (original_full), not {cfg.dense_max_len}", "dense_max_len")
    reference = dict(reference_fields(cfg), max_position_embeddings=cfg.max_seq_len, use_bias=True,
                     rescale_embeddings=cfg.scale_embeddings, block_size=cfg.block_size,
                     num_random_blocks=cfg.n_random_blocks,
                     attention_type=("original_full" if cfg.dense_max_len == cfg.max_seq_len
                                     else "block_sparse"))
    if cfg.pooler_activation != "tanh":  # a hint for config(); save_hf writes the architecture of the heads
        reference["architectures"] = [CLASSIFIER]
    return reference


def head_rules(name: str, kind: str, cfg: ModelConfig) -> list:
    """Where each head's tensors live in a BigBird checkpoint."""
    h = f"heads.{name}"
    if kind == "lm":
        rules = [*linear(f"{h}.transform", "cls.predictions.transform.dense"),
                 *linear(f"{h}.norm", "cls.predictions.transform.LayerNorm"),
                 Rule(f"{h}.bias", ("cls.predictions.bias",))]
        if not cfg.tie_embeddings:
            # untied, the reference ties nothing: the decoder's own bias is the one applied (the
            # later rule wins on import); export writes ours to both names
            rules += [Rule(f"{h}.decoder.weight", ("cls.predictions.decoder.weight",)),
                      Rule(f"{h}.bias", ("cls.predictions.decoder.bias",), "clone")]
        return rules
    if kind == "pooler":  # the reference's pooler is a bare Linear
        return linear(f"{h}.dense", "pooler")
    if name == "nsp":
        return [*linear(f"{h}.pooler.dense", "pooler"), *linear(f"{h}.classifier", "cls.seq_relationship")]
    if kind == "classification":  # dense + hidden_act + out_proj on the first token
        return [*linear(f"{h}.pooler.dense", "classifier.dense"),
                *linear(f"{h}.classifier", "classifier.out_proj")]
    if kind == "token-classification":
        return linear(f"{h}.classifier", "classifier")
    if kind == "span-qa":
        qa = "qa_classifier"
        return [*linear(f"{h}.ffn.up", f"{qa}.intermediate.dense"),
                *linear(f"{h}.ffn.down", f"{qa}.output.dense"),
                *linear(f"{h}.norm", f"{qa}.output.LayerNorm"), *linear(f"{h}.qa", f"{qa}.qa_outputs")]
    raise ConfigError(f"head kind {kind!r} has no BigBird checkpoint layout", "kind")


def _with_pooler(kind: str) -> Callable:
    """A task head plus the unused pooler its checkpoint keeps."""
    return lambda hf: [(kind, kind, {"n_labels": n_labels(hf)}), ("pooler", "pooler", {})]


FAMILY = Family(
    model_types=("big_bird",),
    prefix="bert.",
    config=config,
    backbone=bert.backbone,  # the same tensor names as BERT's
    heads={
        "BigBirdModel": lambda hf: [("pooler", "pooler", {})],
        "BigBirdForPreTraining": lambda hf: [("lm", "lm", {}), ("nsp", "classification", {"n_labels": 2})],
        "BigBirdForMaskedLM": lambda hf: [("lm", "lm", {}), ("pooler", "pooler", {})],
        CLASSIFIER: _with_pooler("classification"),
        "BigBirdForTokenClassification": _with_pooler("token-classification"),
        "BigBirdForQuestionAnswering": lambda hf: [("span-qa", "span-qa", {"ffn": True})],
    },
    head_rules=head_rules,
    to_reference=to_reference,
    bare=("BigBirdModel",),
    head_keys=r"(cls|classifier|qa_classifier)\..*",
    # position_ids buffers of old checkpoints; the tied decoder copies of the token table / bias
    ignore=(r"(.*\.)?position_ids", r"cls\.predictions\.decoder\.(weight|bias)"),
    refine=tied_by_weights("embeddings.word_embeddings.weight", "cls.predictions.decoder.weight",
                           ("cls.predictions.bias", "cls.predictions.decoder.bias")),
)
