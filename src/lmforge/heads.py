"""Task heads that sit on the backbone's hidden states; the backbone never imports them.

Each head is built from the model it attaches to (`make_head(model, kind, **args)`),
records its kind and arguments in `spec` so a checkpoint can rebuild it, and maps
(hidden (B, T, d_model), attention_mask (B, T) | None) to its output.
"""
from __future__ import annotations

import inspect

import torch
from torch import nn

from lmforge.config import ConfigError
from lmforge.config.checks import validate_lm_head
from lmforge.config.model import MAX_VOCAB
from lmforge.config.options import checked_argument, refuse_unknown
from lmforge.layers.feedforward import ACTIVATIONS, FeedForward, activation
from lmforge.layers.norms import make_norm
from lmforge.model import init_weights
from lmforge.utils.errors import shown


class LMHead(nn.Module):
    """Vocabulary logits; BERT's transform (dense, activation, norm) first where the family has it,
    and the projection tied to the token table (Press & Wolf 2017) unless tie_embeddings=False or ELMo."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        cfg = model.config
        self.spec = {"kind": "lm"}
        E = cfg.embed_dim
        self.transform = nn.Linear(cfg.d_model, E) if cfg.lm_transform else None
        self.act = ACTIVATIONS[cfg.lm_activation][0] if cfg.lm_activation else activation(cfg)
        self.norm = make_norm(cfg, E) if cfg.lm_transform else None
        elmo = cfg.architecture == "elmo"
        # the one place the scale is applied, tied or not: the reference scales by its scale_decoder_outputs
        # alone, a checkpoint's own lm_head too. Not on an ELMo, which no reference scales (kept_inert lists
        # the field there, so an ELMo made from T5's fields keeps the softmax its presets train)
        self.logit_scale = cfg.d_model ** -0.5 if cfg.tied_logit_scale and not elmo else 1.0
        # an ELMo reads characters: no token table to tie to (a tie_embeddings it inherits from the default
        # or another preset's fields has no effect: config/checks.py's kept_inert)
        if cfg.tie_embeddings and not elmo:
            # here, not at the config: a model without an LM head (a classifier, ELECTRA's discriminator, its
            # generator taking the transform) reads no tied table, whatever its widths
            validate_lm_head(cfg)
            object.__setattr__(self, "tied", model.tokens)  # a reference, not a second parameter
            self.decoder = None
        else:
            in_dim = E if cfg.lm_transform else cfg.d_model
            self.decoder = nn.Linear(in_dim, cfg.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.lm_bias else None

    def forward(self, hidden: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """(..., d_model) -> (..., vocab_size); works on selected positions (N, d_model) too."""
        return self.project(self.features(hidden))

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d_model) -> (..., E): what the vocabulary projection reads (transform and scale applied)."""
        if self.transform is not None:
            hidden = self.norm(self.act(self.transform(hidden)))
        return hidden * self.logit_scale if self.logit_scale != 1.0 else hidden

    def projection(self) -> tuple:
        """The vocabulary projection's (vocab_size, E) weight and its (vocab_size,) bias or None."""
        return (self.tied.weight if self.decoder is None else self.decoder.weight), self.bias

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """(..., E) features -> (..., vocab_size) logits."""
        return nn.functional.linear(features, *self.projection())


def pool(hidden: torch.Tensor, attention_mask, how: str) -> torch.Tensor:
    """(B, T, d) -> (B, d): the first token ([CLS]), the last real token ([EXTRACT]) or the mean."""
    if how == "first":
        return hidden[:, 0]
    if attention_mask is None:
        attention_mask = torch.ones(hidden.shape[:2], device=hidden.device)
    mask = attention_mask.to(hidden.dtype)
    if how == "mean":
        return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
    # last real token, robust to left and right padding: the highest index with mask 1
    index = (mask * torch.arange(mask.shape[1], device=mask.device)).argmax(1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]


POOLINGS = ("first", "last", "mean")
POOLER_ACTIVATIONS = {"tanh": torch.tanh, "relu": nn.functional.relu, "gelu": nn.functional.gelu,
                      "gelu-tanh": ACTIVATIONS["gelu-tanh"][0]}


class Pooler(nn.Module):
    """BERT's pooler: tanh(W h_[CLS] + b), the input of NSP and sentence classification
    (DistilBERT's pre-classifier uses relu, ELECTRA's classification head gelu: `pooler_activation`)."""

    def __init__(self, model: nn.Module, pooling: str = "first") -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ConfigError(f"pooling={pooling!r} is not one of {', '.join(POOLINGS)}", "pooling")
        self.spec = {"kind": "pooler", "pooling": pooling}
        self.pooling = pooling
        self.dense = nn.Linear(model.config.d_model, model.config.d_model)
        self.act = POOLER_ACTIVATIONS[model.config.pooler_activation]

    def forward(self, hidden: torch.Tensor, attention_mask=None) -> torch.Tensor:  # -> (B, d_model)
        return self.act(self.dense(pool(hidden, attention_mask, self.pooling)))


class SequenceClassificationHead(nn.Module):
    """Sentence (pair) classification or regression (n_labels=1) from a pooled representation."""

    def __init__(self, model: nn.Module, n_labels: int, pooling: str = "first", pooler: bool = True,
                 bias: bool = True) -> None:
        super().__init__()
        if n_labels < 1:
            raise ConfigError(f"n_labels={n_labels} must be >= 1", "n_labels")
        self.spec = {"kind": "classification", "n_labels": n_labels, "pooling": pooling, "pooler": pooler}
        if not bias:  # decoders' scores (GPT, Llama, BLOOM) project without a bias
            self.spec["bias"] = False
        self.pooler = Pooler(model, pooling) if pooler else None
        self.pooling = pooling
        self.dropout = nn.Dropout(model.config.dropout)
        self.classifier = nn.Linear(model.config.d_model, n_labels, bias=bias)

    def forward(self, hidden: torch.Tensor, attention_mask=None) -> torch.Tensor:  # -> (B, n_labels)
        pooled = (self.pooler(hidden, attention_mask) if self.pooler is not None
                  else pool(hidden, attention_mask, self.pooling))
        return self.classifier(self.dropout(pooled))


class TokenClassificationHead(nn.Module):
    """A label per position (tagging, NER)."""

    def __init__(self, model: nn.Module, n_labels: int) -> None:
        super().__init__()
        self.spec = {"kind": "token-classification", "n_labels": n_labels}
        self.dropout = nn.Dropout(model.config.dropout)
        self.classifier = nn.Linear(model.config.d_model, n_labels)

    def forward(self, hidden: torch.Tensor, attention_mask=None) -> torch.Tensor:  # -> (B, T, n_labels)
        return self.classifier(self.dropout(hidden))


class SpanQAHead(nn.Module):
    """Extractive QA (BERT sec. 4.2): start and end logits per position, (B, T, 2)."""

    def __init__(self, model: nn.Module, ffn: bool = False) -> None:
        super().__init__()
        cfg = model.config
        self.spec = {"kind": "span-qa", **({"ffn": True} if ffn else {})}
        # BigBird's QA head first runs one more post-norm feed-forward sub-layer over the states
        self.ffn = FeedForward(cfg) if ffn else None
        self.norm = make_norm(cfg) if ffn else None
        self.dropout = nn.Dropout(cfg.dropout)
        self.qa = nn.Linear(cfg.d_model, 2)

    def forward(self, hidden: torch.Tensor, attention_mask=None) -> torch.Tensor:
        if self.ffn is not None:  # Norm(h + FFN(h)), dropout on the sub-layer's input and output
            hidden = self.norm(hidden + self.dropout(self.ffn(self.dropout(hidden))))
        logits = self.qa(hidden)
        if attention_mask is not None:  # padding can never be an answer boundary
            logits = logits.masked_fill(~attention_mask.bool()[..., None], torch.finfo(logits.dtype).min)
        return logits


class ReplacedTokenDetectionHead(nn.Module):
    """ELECTRA's discriminator (Clark et al. 2020, sec. 2): dense, activation, then one logit per
    token that it was replaced by the generator, (B, T)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        d = model.config.d_model
        self.spec = {"kind": "rtd"}
        self.dense = nn.Linear(d, d)
        self.act = activation(model.config)
        self.score = nn.Linear(d, 1)

    def forward(self, hidden: torch.Tensor, attention_mask=None) -> torch.Tensor:  # -> (B, T)
        return self.score(self.act(self.dense(hidden))).squeeze(-1)


HEADS = {
    "lm": LMHead,
    "pooler": Pooler,
    "classification": SequenceClassificationHead,
    "token-classification": TokenClassificationHead,
    "span-qa": SpanQAHead,
    "rtd": ReplacedTokenDetectionHead,
}


# the kind each head argument must have (a bool n_labels read as 1, 2.5 failed inside torch.empty)
HEAD_ARGUMENTS = {"n_labels": ("int", {"low": 1, "high": MAX_VOCAB}), "pooling": ("str", {}),
                  "pooler": ("bool", {}), "bias": ("bool", {}), "ffn": ("bool", {})}


def _checked_arguments(kind: str, args: dict) -> dict:
    """A head's keyword arguments read and checked as options fields are, each error a ConfigError naming
    it: an unknown one, or one of the wrong type or out of bounds."""
    known = [name for name in inspect.signature(HEADS[kind]).parameters if name != "model"]
    refuse_unknown(args, known, f"{kind} head", ConfigError)
    return {name: checked_argument(name, *HEAD_ARGUMENTS[name], value, ConfigError)
            if name in HEAD_ARGUMENTS else value for name, value in args.items()}


def make_head(model: nn.Module, kind: str, **args) -> nn.Module:
    """Build a head of `kind` for `model` (not yet attached)."""
    if not isinstance(kind, str) or kind not in HEADS:
        raise ConfigError(f"head kind {shown(kind)} is not one of {', '.join(HEADS)}", "kind")
    head = HEADS[kind](model, **_checked_arguments(kind, args))
    init_weights(head)
    return head


def attach(model: nn.Module, kind: str, name: str | None = None, **args) -> nn.Module:
    """Build a head and attach it to `model` under `name` (default: the kind); returns the head."""
    if not hasattr(model, "add_head"):  # None or a name failed as "has no attribute 'add_head'"
        raise ConfigError(f"model must be an lmforge model (lmforge.build, lmforge.load), got "
                          f"{type(model).__name__}", "model")
    if name is not None and not (isinstance(name, str) and name.strip() and "." not in name):
        raise ConfigError(f"name must be a head's name (text without a dot), got {shown(name)}", "name")
    return model.add_head(name or kind, make_head(model, kind, **args))
