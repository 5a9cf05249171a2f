"""Sequence-level tasks: single-sentence and sentence-pair classification, regression (STS-B) and
multiple choice (SWAG), on any architecture.

Where the score is read (BERT sec. 4.1; GPT sec. 3.3; BART sec. 3.2):
- encoders: the pooled first token ([CLS]) -> SequenceClassificationHead;
- decoders: the last real token ([EXTRACT]), no pooler and no bias, as GPT-2 / Llama's
  sequence classifiers;
- encoder-decoders: BART's scheme: the encoder reads the text, the decoder reads the same text
  shifted right (after decoder_start_token_id) and the decoder's last real position is pooled
  (fine-tuning casts the task as text instead where the family has no such head, as T5:
  tasks/text2text.py).
Regression is one output trained with mean squared error, or, where its score is the output's sigmoid (a
CrossEncoder's activation), with binary cross-entropy on the logit against labels in [0, 1], as
sentence-transformers trains a one-output CrossEncoder; multiple choice scores each
(context, ending) pair with one output and takes a softmax over a record's choices; multi-label
classification (the reference's problem_type "multi_label_classification") is a sigmoid per label,
trained with binary cross-entropy averaged over labels and examples, any number of labels true.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lmforge.config.options import OptionsError
from lmforge.io.labels import ACTIVATIONS, known_activation
from lmforge.objectives.base import Loss
from lmforge.tasks import metrics
from lmforge.tasks.base import Task, register
from lmforge.utils.errors import shown


def checked_activation(activation: str | None, default: str) -> str:
    """A regression's or reranker's activation option (`default` where None), or an OptionsError naming it."""
    if activation is None:
        return default
    if not known_activation(activation):
        raise OptionsError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {shown(activation)}",
                           "activation")
    return activation


def shift_right(ids: torch.Tensor, start: int) -> torch.Tensor:
    """(B, T) -> (B, T) decoder inputs: `start`, then the ids without their last one."""
    return torch.cat([torch.full_like(ids[:, :1], start), ids[:, :-1]], dim=1)


class SequenceTask(Task):
    """Shared by the sequence-level tasks: encoding a text (pair) and the pooled scores."""

    head = "classification"
    n_outputs = 0  # outputs of the head; 0: one per label

    def head_args(self) -> dict:
        """Head shape of the architecture (see the module docstring)."""
        n = self.n_outputs or len(self.labels or ())
        if n < 1:
            raise ValueError(f"task {self.kind!r} needs the list of labels")
        arch = self.model.config.architecture
        if arch == "decoder":
            return {"n_labels": n, "pooling": "last", "pooler": False, "bias": False}
        # XLNet's <cls> ends the text (its reference head pools the last token); BERT's opens it
        last = arch == "encoder-decoder" or self.model.config.position == "xl-relative"
        own = self.model.heads[self.head].spec if self.head in self.model.heads else {}
        if last and arch == "encoder" and own.get("n_labels") == n:  # an XLNet head fine-tuned on its
            return {"n_labels": n, "pooling": own.get("pooling", "last")}  # first token before: kept
        return {"n_labels": n, "pooling": "last" if last else "first"}

    def info(self) -> dict:
        """task.json's fields; an encoder-decoder's also says it is not text-to-text."""
        info = super().info()
        encoder_decoder = self.model.config.architecture == "encoder-decoder"
        return {**info, "text_to_text": False} if encoder_decoder else info

    def encode_text(self, text: str, pair: str | None = None) -> dict:
        """Token ids (and segment ids where the model has segment embeddings) of a text (pair)."""
        enc = self.encode_capped(text, pair)
        cfg = self.model.config
        if cfg.architecture == "encoder" and cfg.n_segments > 1:
            return {"input_ids": enc.ids, "segment_ids": enc.segment_ids}
        return {"input_ids": enc.ids}

    def scores(self, batch: dict) -> torch.Tensor:
        """(B, n_outputs) head outputs of a padded batch."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        cfg = self.model.config
        if cfg.architecture == "encoder":
            out = self.model(ids, mask, segment_ids=batch.get("segment_ids"), run_heads=False)
        elif cfg.architecture == "decoder":
            out = self.model(ids, mask, run_heads=False)
        else:
            start = cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else self.pad_id
            out = self.model(ids, mask, decoder_input_ids=shift_right(ids, start),
                             decoder_attention_mask=mask, run_heads=False)
        return self.task_head(out.last_hidden_state, mask).float()


@register
class ClassificationTask(SequenceTask):
    """Single-sentence classification (SST-2, CoLA): text -> one of `labels`."""

    kind = "cls"

    def head_args(self) -> dict:
        """SequenceTask's head, of one output per label: two labels at least."""
        if self.labels is not None and len(self.labels) == 1:
            # a softmax over one output is 1 whatever the input: a loss of 0 that trains nothing, and the
            # exported head (num_labels 1) the reference reads as a regression
            raise ValueError(f"task {self.kind!r} needs two labels at least, got only {self.labels[0]!r} "
                             f"(a training split of one class); for a score use task regression")
        return super().head_args()

    def pair_of(self, record: dict):
        """The second text of the record (None for single sentences)."""
        return None

    def encode(self, record: dict) -> list:
        """One example: the text (pair) and the label's index (when the record has a label)."""
        example = self.encode_text(record["text"], self.pair_of(record))
        if record.get("label") is not None:
            example["label"] = self.label_index(record)
        return [example]

    def forward(self, batch: dict) -> Loss:
        """Cross-entropy of the label."""
        logits = self.scores(batch)
        loss = F.cross_entropy(logits, batch["label"])
        return Loss(loss, {"accuracy": (logits.argmax(-1) == batch["label"]).float().mean().detach()})

    def predict(self, batch: dict) -> list:
        """The label probabilities of each example."""
        return self.scores(batch).softmax(-1).tolist()

    def decode(self, records: list, examples: list, outputs: list) -> list:
        """The most probable label of each record."""
        return [self.labels[max(range(len(p)), key=p.__getitem__)] for p in outputs]

    def score(self, records: list, predictions: list) -> dict:
        """accuracy (primary), f1 and matthews."""
        return metrics.classification_metrics([r["label"] for r in records], predictions, self.labels)


@register
class PairClassificationTask(ClassificationTask):
    """Sentence-pair classification (MNLI, QQP): [CLS] text [SEP] text_pair [SEP] -> label."""

    kind = "pair"

    def pair_of(self, record: dict):
        """The record's second text."""
        return record["text_pair"]


@register
class RegressionTask(SequenceTask):
    """A real-valued score of a text or text pair (STS-B): one output, mean squared error (sigmoid: BCE)."""

    kind = "regression"
    n_outputs = 1
    options = ("activation",)

    def __init__(self, model, tokenizer, labels: list | None = None, max_len: int = 128,
                 activation: str | None = None) -> None:
        # identity: the raw score; a CrossEncoder folder's "sigmoid" reads it as CrossEncoder.predict does
        self.activation = checked_activation(activation, "identity")
        super().__init__(model, tokenizer, labels, max_len)

    def encode(self, record: dict) -> list:
        """One example: the text (pair) and the float label (when present)."""
        example = self.encode_text(record["text"], record.get("text_pair"))
        if record.get("label") is not None:
            example["label"] = float(record["label"])
        return [example]

    def check_trainable(self, records: list, split: str = "training") -> None:
        """A sigmoid regression trains BCE on labels in [0, 1]: one outside (NaN too) is refused naming its
        line. Evaluation reads any scale (Spearman is scale-free), so encode does not refuse it."""
        if self.activation != "sigmoid":
            return
        for record in records:
            label = record.get("label")
            if label is not None and not 0 <= float(label) <= 1:
                raise ValueError(f"line {record.get('line', '?')}: label {float(label):g} is outside [0, 1], "
                                 "the scores of activation=sigmoid (trained by BCE on the logit, as a "
                                 "CrossEncoder); activation=identity regresses any value")

    def forward(self, batch: dict) -> Loss:
        """Mean squared error of the one output; with a sigmoid activation, the binary cross-entropy of its
        logit (the score sigmoid(logit) is what is trained)."""
        scores = self.scores(batch).squeeze(-1)
        if self.activation == "sigmoid":
            return Loss(F.binary_cross_entropy_with_logits(scores, batch["label"]))
        return Loss(F.mse_loss(scores, batch["label"]))

    def predict(self, batch: dict) -> list:
        """The predicted value of each example (through `activation`)."""
        scores = self.scores(batch).squeeze(-1)
        return (scores.sigmoid() if self.activation == "sigmoid" else scores).tolist()

    def decode(self, records: list, examples: list, outputs: list) -> list:
        """The value itself."""
        return list(outputs)

    def score(self, records: list, predictions: list) -> dict:
        """pearson (primary), spearman and mse."""
        return metrics.regression_metrics([float(r["label"]) for r in records], predictions)


@register
class MultipleChoiceTask(SequenceTask):
    """Multiple choice (SWAG): each (context, ending) pair gets one score; softmax over a record's
    endings. Batches hold (B x C) sequences; records with fewer endings are padded with copies
    masked out of the softmax."""

    kind = "choice"
    n_outputs = 1

    def encode(self, record: dict) -> list:
        """One example holding every choice's encoding, and the gold choice (when present)."""
        example = {"choices": [self.encode_text(record["text"], c) for c in record["choices"]]}
        if record.get("label") is not None:
            example["label"] = int(record["label"])
        return [example]

    def length(self, example: dict) -> int:
        """Tokens of the longest choice."""
        return max(len(c["input_ids"]) for c in example["choices"])

    def outputs(self, examples: list, batch_size: int = 64) -> list:
        """Task.outputs of the records with as many choices at a time: collate pads every record to its
        batch's most choices, so one record of 1000 among records of 2 would make each 1000 sequences."""
        groups: dict = {}
        for i, example in enumerate(examples):
            groups.setdefault(len(example["choices"]), []).append(i)
        out: list = [None] * len(examples)
        for members in groups.values():
            for i, value in zip(members, Task.outputs(self, [examples[i] for i in members], batch_size)):
                out[i] = value
        return out

    def collate(self, examples: list) -> dict:
        """(B x C, T) choice sequences, the (B, C) choice mask and the labels."""
        C = max(len(e["choices"]) for e in examples)
        flat = [e["choices"][min(c, len(e["choices"]) - 1)] for e in examples for c in range(C)]
        batch = Task.collate(self, flat)
        batch["choice_mask"] = torch.tensor([[c < len(e["choices"]) for c in range(C)] for e in examples])
        if "label" in examples[0]:
            batch["label"] = torch.tensor([e["label"] for e in examples])
        return batch

    def choice_scores(self, batch: dict) -> torch.Tensor:
        """(B, C) scores, -inf at padding choices."""
        mask = batch["choice_mask"]
        scores = self.scores(batch).view(mask.shape)
        return scores.masked_fill(~mask, float("-inf"))

    def forward(self, batch: dict) -> Loss:
        """Cross-entropy over each record's choices."""
        scores = self.choice_scores(batch)
        loss = F.cross_entropy(scores, batch["label"])
        return Loss(loss, {"accuracy": (scores.argmax(-1) == batch["label"]).float().mean().detach()})

    def predict(self, batch: dict) -> list:
        """Each record's probabilities over its own choices."""
        probs = self.choice_scores(batch).softmax(-1)
        return [row[: int(n)] for row, n in zip(probs.tolist(), batch["choice_mask"].sum(-1))]

    def decode(self, records: list, examples: list, outputs: list) -> list:
        """The index of the most probable choice."""
        return [max(range(len(p)), key=p.__getitem__) for p in outputs]

    def score(self, records: list, predictions: list) -> dict:
        """accuracy."""
        return {"accuracy": metrics.accuracy([int(r["label"]) for r in records], predictions)}


@register
class MultiLabelTask(SequenceTask):
    """Multi-label classification of a text (pair): an output per label, each label true where its
    sigmoid exceeds `threshold`; the record's label is the list of its true labels."""

    kind = "multilabel"
    options = ("threshold",)

    def __init__(self, model, tokenizer, labels: list | None = None, max_len: int = 128,
                 threshold: float = 0.5) -> None:
        super().__init__(model, tokenizer, labels=labels, max_len=max_len)
        self.threshold = threshold

    @classmethod
    def labels_from(cls, records: list) -> list | None:
        """The sorted labels that the records' label lists name (None when they name none)."""
        found = sorted({label for r in records if r.get("label") is not None for label in r["label"]})
        return found or None

    def encode(self, record: dict) -> list:
        """One example: the text (pair) and, when the record has labels, 0 / 1 for each of `labels`."""
        example = self.encode_text(record["text"], record.get("text_pair"))
        if record.get("label") is not None:  # each label's position as a cls label's (unknown: refused)
            example["label"] = [0] * len(self.labels)
            for label in record["label"]:
                example["label"][self.label_index({**record, "label": label})] = 1
        return [example]

    def collate(self, examples: list) -> dict:
        """A padded batch; the labels a (B, n_labels) float tensor of 0 / 1."""
        batch = super().collate([{k: v for k, v in e.items() if k != "label"} for e in examples])
        if "label" in examples[0]:
            batch["label"] = torch.tensor([e["label"] for e in examples], dtype=torch.float)
        return batch

    def forward(self, batch: dict) -> Loss:
        """Binary cross-entropy with logits of each label, the mean over labels and examples."""
        logits = self.scores(batch)
        loss = F.binary_cross_entropy_with_logits(logits, batch["label"])
        exact = ((logits.sigmoid() > self.threshold) == batch["label"].bool()).all(-1).float().mean()
        return Loss(loss, {"subset_accuracy": exact.detach()})

    def predict(self, batch: dict) -> list:
        """Each label's probability (its sigmoid) for each example."""
        return self.scores(batch).sigmoid().tolist()

    def decode(self, records: list, examples: list, outputs: list) -> list:
        """The labels whose probability exceeds the threshold, in `labels` order."""
        return [[label for label, p in zip(self.labels, probs) if p > self.threshold] for probs in outputs]

    def score(self, records: list, predictions: list) -> dict:
        """micro_f1 (primary), macro_f1 and subset_accuracy."""
        return metrics.multilabel_metrics([r["label"] for r in records], predictions, self.labels)
