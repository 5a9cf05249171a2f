"""Dense Passage Retrieval (Karpukhin et al. 2020): a bi-encoder scores a question q and a passage p
by the inner product sim(q, p) = E_Q(q)^T E_P(p) (eq. 1), trained with the negative log-likelihood
of the positive passage against the other passages of the batch (in-batch negatives, sec. 3.2) and
one BM25 hard negative per question (their best setting, table 3).

Here E_Q and E_P share one encoder by default (any lmforge encoder: a tiny BERT, all-MiniLM-L6-v2, a
pretrained directory); with separate(), E_P becomes a copy trained on its own, as in DPR (saved under
passage/ beside the question encoder). Vectors are pooled by mean over the attention mask or the first
token ([CLS]). With normalize=True the embeddings are L2-normalised and the logits are sim / temperature
(cosine similarity, as the sentence-embedding models it starts from were trained), so the untrained
encoder is a fair baseline.

With matryoshka_dims (Matryoshka Representation Learning, Kusupati et al. 2022, as sentence-transformers'
MatryoshkaLoss) the loss is the weighted sum of the same loss on nested prefixes of the embeddings, each
prefix L2-normalised again when the similarity is cosine, so the first d/4 coordinates alone still retrieve.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from lmforge.config.options import Items, OptionsError, check_options, option
from lmforge.fast.optimize import optimize
from lmforge.heads import pool
from lmforge.io import load
from lmforge.io.native import CheckpointError, read_json_object
from lmforge.io.resolve import find_model_dir
from lmforge.objectives.base import Loss, Objective, pad
from lmforge.pipelines.embed_options import leading
from lmforge.tokenizer import load_tokenizer
from lmforge.utils.atomic import atomic_write_text, refuse_link
from lmforge.utils.checksum import model_fingerprint
from lmforge.utils.model_folder import check_recorded, record_sums

POOLINGS = {"mean": "mean", "cls": "first"}
RETRIEVER_FILE, PASSAGE_DIR = "retriever.json", "passage"  # a retriever folder's options, its own E_P
SEPARATE = "passage_encoder"  # retriever.json's field beside the options: whether passage/ holds E_P


MAX_DIMS = 65536  # a bound on any embedding width (and on how many prefixes are listed)


@dataclass(frozen=True)
class EncoderOptions:
    """How texts become vectors: pooling, normalisation, temperature, the longest input, and the nested
    prefixes a Matryoshka loss trains."""

    pooling: str = option("mean", "mean (over the attention mask) or cls (the first token)",
                          choices=tuple(POOLINGS))
    normalize: bool = option(True, "L2-normalise embeddings (cosine similarity, logits / temperature)")
    temperature: float = option(0.05, "softmax temperature of the normalised scores in training", low=0,
                                open_low=True, high=100.0)
    max_length: int = option(128, "tokens per question or passage", low=2, high=MAX_DIMS)
    matryoshka_dims: tuple = option((), "Matryoshka loss: the DPR loss summed over these prefix widths "
                                    "(e.g. [384,192,96,48]; each <= the model width); [] for the plain loss",
                                    items=Items("int", 16, distinct=True), low=1, high=MAX_DIMS)
    matryoshka_weights: tuple = option((), "each prefix's weight in the Matryoshka sum, as many as "
                                       "matryoshka_dims; [] for all 1", items=Items("float", 16), low=0,
                                       high=1e3)

    def __post_init__(self) -> None:
        check_options(self)
        # JSON (retriever.json) gives lists: kept as tuples, so a reloaded encoder's options compare equal
        object.__setattr__(self, "matryoshka_dims", tuple(self.matryoshka_dims))
        object.__setattr__(self, "matryoshka_weights", tuple(self.matryoshka_weights))
        dims, weights = self.matryoshka_dims, self.matryoshka_weights
        if weights and len(weights) != len(dims):
            raise OptionsError(f"matryoshka_weights must hold one weight per matryoshka_dims ({len(dims)}), "
                               f"got {len(weights)}", "matryoshka_weights")


def retriever_file(path: Path) -> tuple:
    """(EncoderOptions fields, whether passages have an encoder of their own) of a model folder. One with
    retriever.json was written by BiEncoder.save: the file (verified against the checksum its config.json
    records) and, where it says so, passage/ are read whole or refused naming the file. One without is a
    plain encoder (shared, default options), unless it holds passage/ or its config.json records the file:
    a retriever that lost its retriever.json."""
    file = path / RETRIEVER_FILE
    if not file.is_file():
        if (path / PASSAGE_DIR).exists():
            raise ValueError(f"{file}: missing, though {path / PASSAGE_DIR} holds a passage encoder; a "
                             f"retriever folder is read whole: save or train it again")
        check_recorded(path, RETRIEVER_FILE, CheckpointError)
        return {}, False
    saved = read_json_object(file)
    # a file written before SEPARATE was recorded: passage/ says it
    separate = saved.pop(SEPARATE, (path / PASSAGE_DIR).exists())
    unknown = sorted(set(saved) - {f.name for f in fields(EncoderOptions)})
    if unknown or not isinstance(separate, bool):
        raise ValueError(f"{file}: " + (f"unknown field(s) {unknown}" if unknown else
                                        f"field {SEPARATE!r} must be true or false"))
    try:
        EncoderOptions(**saved)
    except OptionsError as err:
        raise ValueError(f"{file}: {err}") from None
    if separate and not (path / PASSAGE_DIR / "config.json").is_file():
        raise ValueError(f"{path / PASSAGE_DIR / 'config.json'}: missing; {file} says the passages have an "
                         f"encoder of their own")
    if not separate and (path / PASSAGE_DIR).exists():
        raise ValueError(f"{path / PASSAGE_DIR}: a passage encoder, but {file} says the passages share the "
                         f"question encoder")
    check_recorded(path, RETRIEVER_FILE, CheckpointError)  # last, so that an edited field is named above
    return saved, separate


class BiEncoder:
    """E_Q and E_P (one shared encoder, or two after separate()): texts -> (N, d) embeddings."""

    def __init__(self, model, tokenizer, options: EncoderOptions | None = None, passage_model=None) -> None:
        for m in (model, passage_model or model):
            if m.config.architecture != "encoder":
                raise OptionsError(f"a DPR encoder must be an encoder model, not {m.config.architecture}",
                                   "model")  # the field: the command line names its --model
        self.model, self.tokenizer, self.options = model, tokenizer, options or EncoderOptions()
        self.passage_model = passage_model  # None: E_P is E_Q
        self.cut = 0  # texts cut to max_length so far (an index build says how many of its passages)
        if any(d > model.config.d_model for d in self.options.matryoshka_dims):
            raise OptionsError(f"matryoshka_dims {list(self.options.matryoshka_dims)}: this model's "
                               f"embeddings have {model.config.d_model}", "matryoshka_dims")

    def separate(self) -> "BiEncoder":
        """Give passages their own encoder, a copy of the question encoder (DPR's two BERTs)."""
        if self.passage_model is None:
            self.passage_model = copy.deepcopy(self.model)
        return self

    @classmethod
    def from_dir(cls, name: str | os.PathLike, **options) -> "BiEncoder":
        """A retriever folder (saved by save(): read whole, see retriever_file) or any other model directory
        or installed package (all-MiniLM-L6-v2: a plain encoder, shared, default options); `options` over
        the saved ones."""
        path = find_model_dir(name)
        saved, separate = retriever_file(path)
        # retrieval jobs embed corpora: the encoders run optimized (fast/optimize.py), as every job's do
        passage = optimize(load(path / PASSAGE_DIR)) if separate else None
        return cls(optimize(load(path)), load_tokenizer(path), EncoderOptions(**{**saved, **options}),
                   passage)

    def save(self, path) -> Path:
        """Tokenizer and retriever.json beside a saved model directory (and a separate passage
        encoder under passage/); retriever.json last, so a folder that has it is whole. A symbolic link
        at `path` is refused (UnsafePath), never written through, as model.save refuses it."""
        path = refuse_link(path)
        if self.passage_model is not None:
            self.passage_model.save(path / PASSAGE_DIR)
        self.tokenizer.save(path)
        saved = {**asdict(self.options), SEPARATE: self.passage_model is not None}
        atomic_write_text(path / RETRIEVER_FILE, json.dumps(saved, indent=2))
        record_sums(path, [RETRIEVER_FILE])  # in the model's config.json: retriever_file verifies it
        return path

    @property
    def width(self) -> int:
        """The width of the vectors it gives (the encoder's d_model)."""
        return self.model.config.d_model

    def fingerprint(self) -> str:
        """The models behind its vectors: E_Q's and E_P's configs and weights (a dense index stores its
        encoder's, so queries from another model are refused, not mis-scored)."""
        return model_fingerprint(self.model, self.encoder_for(passage=True))

    def tokenizer_fingerprint(self) -> str:
        """16 hex digits of the tokenizer's vocabulary and rules (tokenizers' JSON, without the truncation
        and padding a call sets): one model's weights read through another tokenizer rank nonsense too."""
        spec = json.loads(self.tokenizer.backend.to_str())
        for setting in ("truncation", "padding"):
            spec.pop(setting, None)
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode("utf-8")).hexdigest()[:16]

    def encoder_for(self, passage: bool):
        """E_P for passages when there is one of its own, else E_Q."""
        return self.passage_model if passage and self.passage_model is not None else self.model

    def embed(self, input_ids, attention_mask, passage: bool = False) -> torch.Tensor:  # (B, T) -> (B, d)
        """Pooled (and normalised) states of a padded batch, from E_P if `passage` else E_Q."""
        model = self.encoder_for(passage)
        hidden = model(input_ids, attention_mask, run_heads=False).last_hidden_state
        vectors = pool(hidden.float(), attention_mask, POOLINGS[self.options.pooling])
        return F.normalize(vectors, dim=-1) if self.options.normalize else vectors

    def ids(self, text: str) -> list:
        """Token ids of one text, cut to max_length (the last id kept: [SEP])."""
        ids = self.tokenizer.encode(text).ids
        limit = min(self.options.max_length, self.model.config.max_seq_len)
        self.cut += len(ids) > limit
        return ids if len(ids) <= limit else ids[:limit - 1] + ids[-1:]

    def encode(self, texts: list, batch_size: int = 64, passage: bool = False) -> torch.Tensor:
        """(N, d) embeddings of `texts` (passages with E_P if `passage`), in order, on the CPU (eval
        mode; the caller's mode restored)."""
        return self.encode_ids([self.ids(t) for t in texts], batch_size, passage).cpu()

    @torch.inference_mode()
    def encode_ids(self, rows: list, batch_size: int = 64, passage: bool = False) -> torch.Tensor:
        """(N, d) embeddings of token id lists, on the encoder's device (as encode)."""
        model = self.encoder_for(passage)
        training, device = model.training, next(model.parameters()).device
        model.eval()
        out = []
        try:
            for start in range(0, len(rows), batch_size):
                ids, mask = pad_batch(rows[start:start + batch_size], self.tokenizer.special_id("pad") or 0)
                out.append(self.embed(ids.to(device), mask.to(device), passage))
        finally:
            model.train(training)
        return torch.cat(out) if out else torch.empty(0, self.model.config.d_model, device=device)


def pad_batch(rows: list, pad_id: int) -> tuple:
    """Token id lists -> ((B, T) ids right-padded with pad_id, (B, T) attention mask)."""
    ids = pad(rows, pad_id)
    lengths = torch.tensor([len(r) for r in rows])
    return ids, (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()


def passage_text(p) -> str:
    """What the passage encoder reads: title, then text (DPR joins them with [SEP]; a space here)."""
    return f"{p.title}. {p.text}"


class DPRObjective(Objective):
    """In-batch negatives + hard negatives: cross-entropy of sim(q_i, p_i) against sim(q_i, p_j) for
    every positive p_j of the batch and every hard negative."""

    name = "dpr"

    def __init__(self, encoder: BiEncoder) -> None:
        super().__init__(encoder.model, pad_id=encoder.tokenizer.special_id("pad") or 0)
        self.encoder = encoder
        if encoder.passage_model is not None:
            self.passage_model = encoder.passage_model  # registered: optimised and checkpointed too

    def run_settings(self) -> dict:
        """The encoder options (pooling, temperature, Matryoshka widths ...): recorded in the Trainer's
        checkpoints, so a resume with others is refused rather than continued with them."""
        return asdict(self.encoder.options)

    def collate(self, examples: list) -> dict:
        """{"question", "positive", "negatives"} id lists -> question batch and passage batch
        (positives first, in order, then every hard negative)."""
        questions = [e["question"] for e in examples]
        passages = [e["positive"] for e in examples] + [n for e in examples for n in e["negatives"]]
        q_ids, q_mask = pad_batch(questions, self.pad_id)
        p_ids, p_mask = pad_batch(passages, self.pad_id)
        return {"input_ids": q_ids, "attention_mask": q_mask, "p_input_ids": p_ids,
                "p_attention_mask": p_mask, "same_passage": same_passage(examples, passages)}

    def forward(self, batch: dict) -> Loss:
        """NLL of each question's positive among all passages of the batch (eq. 2); with matryoshka_dims,
        the weighted sum of it over those prefixes of the embeddings (accuracy: the first prefix's)."""
        q = self.encoder.embed(batch["input_ids"], batch["attention_mask"])  # (B, d)
        p = self.encoder.embed(batch["p_input_ids"], batch["p_attention_mask"],
                               passage=True)  # (B + B_neg, d)
        options = self.encoder.options
        dims = options.matryoshka_dims or (q.shape[-1],)  # the plain loss: one "prefix", the whole vector
        weights = options.matryoshka_weights or (1.0,) * len(dims)

        def cut(vectors: torch.Tensor, d: int) -> torch.Tensor:  # embed normalised whole vectors already
            return leading(vectors, d, options.normalize and d < vectors.shape[-1])

        parts = [self.nll(cut(q, d), cut(p, d), batch["same_passage"]) for d in dims]
        loss = sum(w * part for w, (part, _) in zip(weights, parts))
        metrics = {f"loss_{d}": part.detach() for d, (part, _) in zip(options.matryoshka_dims, parts)}
        return Loss(loss, {"in_batch_accuracy": in_batch_accuracy(parts[0][1]), **metrics})

    def nll(self, q: torch.Tensor, p: torch.Tensor, same_passage: torch.Tensor) -> tuple:
        """(cross-entropy of each question's own positive among the batch's passages, the logits)."""
        scale = 1 / self.encoder.options.temperature if self.encoder.options.normalize else 1.0
        logits = (scale * q @ p.T).masked_fill(same_passage, float("-inf"))  # (B, B + B_neg)
        return F.cross_entropy(logits, torch.arange(len(q), device=q.device)), logits


def same_passage(examples: list, passages: list) -> torch.Tensor:
    """(B, B + B_neg) where a batch passage is no negative of question i: another copy of its positive, or a
    passage whose key (an example's optional "keys": its positive's, then each negative's) is among its own
    "positive_keys" (another of its positives; in ICT, another context cut from its passage, which holds
    the pseudo-question itself)."""
    keys = [e.get("keys", [None] * (1 + len(e["negatives"]))) for e in examples]
    columns = [k[0] for k in keys] + [key for k in keys for key in k[1:]]  # positives, then the negatives
    own = [set(e.get("positive_keys", ())) for e in examples]
    return torch.tensor([[j != i and (passages[j] == passages[i] or columns[j] in own[i])
                          for j in range(len(passages))] for i in range(len(examples))])


def in_batch_accuracy(logits: torch.Tensor) -> torch.Tensor:
    """Share of questions whose own positive (passage i for question i) scores highest, detached."""
    return (logits.argmax(-1) == torch.arange(len(logits), device=logits.device)).float().mean().detach()


def training_examples(encoder: BiEncoder, records: list, passages: list, negatives: list) -> list:
    """Question records (+ their hard negative ids) -> token-id examples for DPRObjective; a record's
    first positive is its positive."""
    by_id = {p.id: p for p in passages}
    cache: dict = {}

    def ids(pid: str) -> list:
        if pid not in cache:
            cache[pid] = encoder.ids(passage_text(by_id[pid]))
        return cache[pid]

    # keys: the record's other positives, sharing the batch with it, are no negatives of its question
    return [{"question": encoder.ids(r["question"]), "positive": ids(r["positives"][0]),
             "negatives": [ids(n) for n in negs], "keys": [r["positives"][0], *negs],
             "positive_keys": list(r["positives"])} for r, negs in zip(records, negatives)]
