"""Text-to-text fine-tuning of encoder-decoders (Raffel et al. 2020, T5, sec. 2.4 and app. D):
classification, sentence pairs and regression cast as text in, label words out.

- Input: a task prefix and the text(s) under field names, as T5 wrote GLUE
  ("sst2 sentence: ...", "stsb sentence1: ... sentence2: ..."): here
  "{prefix} sentence: {text}" or "{prefix} sentence1: {text} sentence2: {text_pair}",
  the prefix defaulting to the task kind.
- Target: the label's own words, in the tokenizer's single-text template (T5: "positive </s>";
  BART: "<s> positive </s>"); a regression value rounded to the nearest 0.2 and written with
  one decimal ("3.8"), as T5 did for STS-B (sec. 2.4).
- Training: the seq2seq LM loss of the target (objectives/seq2seq.py).
- Prediction by rank classification: each candidate target (the labels; for regression the
  rounded values the training split showed) is scored by its summed log-likelihood given the
  input and the most likely one wins, so the output is always a valid label. (T5 decoded
  greedily and counted an output matching no label as wrong; ranking the label sequences
  never produces one.) Metrics are those of the head-based tasks (tasks/classify.py).

Which way an encoder-decoder fine-tunes (`text_to_text` in TaskConfig; `choose`): text-to-text
when asked, the classification head of tasks/classify.py when told not to, and by default
the head wherever the model's reference family has a sequence-classification head to match
and export to (BART: BartForSequenceClassification, Lewis et al. 2020 sec. 3.2), else
text-to-text (T5, whose family casts every task as text).
"""
from __future__ import annotations

import torch

from lmforge.objectives.base import Loss
from lmforge.objectives.seq2seq import add_decoder_inputs, shift_right, teacher_forced_loss
from lmforge.tasks import metrics
from lmforge.tasks.base import META, Task

KINDS = ("cls", "pair", "regression")  # the task kinds that have a text-to-text form


def has_reference_head(model) -> bool:
    """Whether the model's Hugging Face family stores a sequence-classification head."""
    from lmforge.convert.hf import family_of

    try:
        _, family = family_of(model.config)
        family.head_rules("classification", "classification", model.config)
    except ValueError:  # no family expresses the config, or the family has no such head (T5)
        return False
    return True


def choose(kind: str, model, text_to_text: bool | None) -> bool:
    """Whether task `kind` on `model` is fine-tuned text-to-text (see the module docstring)."""
    if text_to_text and kind not in KINDS:
        raise ValueError(f"text_to_text: task {kind!r} has no text-to-text form (kinds: {', '.join(KINDS)})")
    if text_to_text and model.config.architecture != "encoder-decoder":
        raise ValueError(f"text_to_text needs an encoder-decoder (T5, BART); this model is a "
                         f"{model.config.architecture}")
    if text_to_text is not None:
        return bool(text_to_text)
    return kind in KINDS and model.config.architecture == "encoder-decoder" and not has_reference_head(model)


def round_value(value) -> str:
    """A regression label as T5's target text: rounded to the nearest 0.2, one decimal."""
    return f"{round(float(value) * 5) / 5 + 0.0:.1f}"  # + 0.0 turns -0.0 into 0.0


class TeacherForced:
    """Collation and loss of tasks whose targets are token sequences the decoder is fed shifted right
    (text-to-text classification here, seq2seq in seq2seq.py): mixed into a Task."""

    def collate(self, examples: list) -> dict:
        """Padded sources; with labels, the decoder's inputs and mask too."""
        batch = super().collate(examples)
        if "labels" in batch:
            clean = [{k: v for k, v in e.items() if k not in META} for e in examples]
            add_decoder_inputs(batch, clean, self.start, self.pad_id)
        return batch

    def forward(self, batch: dict) -> Loss:
        """The teacher-forced cross-entropy of the targets."""
        return teacher_forced_loss(self.model, self.task_head, batch)


class TextToTextTask(TeacherForced, Task):
    """Base of the text-to-text tasks: source text, label targets, loss and rank classification."""

    head = "lm"

    def __init__(self, model, tokenizer, labels: list | None = None, max_len: int = 128,
                 prefix: str | None = None) -> None:
        if model.config.architecture != "encoder-decoder":
            raise ValueError(f"text-to-text fine-tuning needs an encoder-decoder, not a "
                             f"{model.config.architecture}")
        super().__init__(model, tokenizer, labels, max_len)
        self.prefix = self.kind if prefix is None else str(prefix)
        start = model.config.decoder_start_token_id
        self.start = self.pad_id if start is None else start  # T5's convention: the pad id
        if start is None:  # written into the config, so the fine-tuned model generates from it too
            model.config = model.config.replace(decoder_start_token_id=self.start)
        self.targets = self.label_targets()

    def info(self) -> dict:
        """What task.json records: the base fields, text_to_text and the prefix."""
        return {**super().info(), "text_to_text": True, "prefix": self.prefix}

    # ---- data side ----------------------------------------------------------------------------
    def source(self, record: dict) -> str:
        """The encoder's input text of a record (see the module docstring)."""
        if record.get("text_pair") is None:
            return f"{self.prefix} sentence: {record['text']}".strip()
        return f"{self.prefix} sentence1: {record['text']} sentence2: {record['text_pair']}".strip()

    def target(self, text: str, what: str) -> list:
        """Token ids of a target text; an error when it has no words or unknown pieces."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{what} {text!r} is empty: a text-to-text target needs words")
        words = text.strip()  # surrounding spaces are not part of a label's words
        enc = self.tokenizer.encode(words)
        ids, unk = enc.ids, self.tokenizer.unk_id
        unknown = [words[s:e] for i, (s, e) in zip(ids, enc.offsets) if i == unk and unk is not None]
        if unknown:
            raise ValueError(f"{what} {text!r} has text the tokenizer does not know "
                             f"({', '.join(map(repr, unknown))}); rename it with known words")
        eos = self.tokenizer.eos_id
        if eos is not None and ids[-1:] != [eos]:  # the end marker tells "pos" from "pos itive"
            ids.append(eos)
        if len(ids) > self.model.config.max_seq_len:
            raise ValueError(f"{what} {text!r} is {len(ids)} tokens, longer than the decoder's "
                             f"{self.model.config.max_seq_len}")
        return ids

    def label_targets(self) -> list:
        """The candidates' token ids, one per label; distinct labels must encode differently."""
        if not self.labels:
            raise ValueError(f"task {self.kind!r} (text-to-text) needs the list of labels")
        targets, seen = [], {}
        for label in self.labels:
            ids = self.target(label, "label")
            if tuple(ids) in seen:
                raise ValueError(f"labels {seen[tuple(ids)]!r} and {label!r} encode to the same target "
                                 f"{self.tokenizer.tokenize(label)}; make them distinct words")
            seen[tuple(ids)] = label
            targets.append(ids)
        return targets

    def target_of(self, record: dict) -> list:
        """Token ids of a record's gold target."""
        return self.targets[self.label_index(record)]

    def encode(self, record: dict) -> list:
        """One example: the source ids and (when the record has a label) the target as labels."""
        example = {"input_ids": self.encode_capped(self.source(record)).ids}
        if record.get("label") is not None:
            example["labels"] = list(self.target_of(record))
        return [example]

    # ---- model side ---------------------------------------------------------------------------
    def candidate_scores(self, batch: dict) -> torch.Tensor:
        """(B, n_labels) log-likelihood of each label's target given each input: the encoder
        runs once, the decoder once per candidate."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        memory = self.model.encode(ids, mask)
        scores = []
        for target in self.targets:
            labels = torch.tensor(target, device=ids.device).expand(ids.shape[0], -1)  # (B, T)
            decoder_in = shift_right(labels, self.start, self.pad_id)
            hidden = self.model(attention_mask=mask, decoder_input_ids=decoder_in, encoder_output=memory,
                                run_heads=False).last_hidden_state
            logp = self.task_head(hidden).float().log_softmax(-1)  # (B, T, V)
            scores.append(logp.gather(-1, labels[..., None]).squeeze(-1).sum(-1))
        return torch.stack(scores, dim=-1)

    def predict(self, batch: dict) -> list:
        """Each example's log-likelihood of every label."""
        return self.candidate_scores(batch).tolist()

    def decode(self, records: list, examples: list, outputs: list) -> list:
        """The most likely label of each record."""
        return [self.labels[max(range(len(s)), key=s.__getitem__)] for s in outputs]

    def score(self, records: list, predictions: list) -> dict:
        """accuracy (primary), f1 and matthews."""
        return metrics.classification_metrics([r["label"] for r in records], predictions, self.labels)


class TextClassificationTask(TextToTextTask):
    """Single-sentence classification, text-to-text (T5's SST-2, CoLA)."""

    kind = "cls"


class TextPairClassificationTask(TextToTextTask):
    """Sentence-pair classification, text-to-text (T5's MNLI, QQP, RTE)."""

    kind = "pair"


class TextRegressionTask(TextToTextTask):
    """Regression as text (T5's STS-B): the value rounded to 0.2 is the target; the candidates are
    the rounded values of the training split, and the most likely one is the prediction."""

    kind = "regression"

    @classmethod
    def labels_from(cls, records: list) -> list:
        """The rounded values of the training labels, in numeric order."""
        return sorted({round_value(r["label"]) for r in records if r.get("label") is not None}, key=float)

    def target_of(self, record: dict) -> list:
        """The rounded value's token ids (a value outside the candidates still trains)."""
        return self.target(round_value(record["label"]), "regression label")

    def decode(self, records: list, examples: list, outputs: list) -> list:
        """The most likely value of each record, as a float."""
        return [float(label) for label in super().decode(records, examples, outputs)]

    def score(self, records: list, predictions: list) -> dict:
        """pearson (primary), spearman and mse."""
        return metrics.regression_metrics([float(r["label"]) for r in records], predictions)


CLASSES = {cls.kind: cls for cls in (TextClassificationTask, TextPairClassificationTask, TextRegressionTask)}
