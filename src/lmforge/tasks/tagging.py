"""Token classification (tagging, NER; Devlin et al. 2019, sec. 5.3): CoNLL files, tags on
sub-words, entity-level scores.

A word may split into several pieces; its tag goes on the first piece and the other pieces
carry IGNORE (no loss, no prediction), as BERT does for CoNLL-2003 — or, with
`label_all=True`, on every piece (a continuation piece of a B-X word gets I-X). A
prediction is read back off each word's first piece, so `decode` gives exactly one tag per
word; a word cut off by truncation (or one the tokenizer drops) is predicted None (null), scored as
tagged "O" (its gold entity is missed), and counted and said by say_cut.

Words are joined with single spaces and encoded as plain text, so the model sees the text
as it saw it in pretraining (byte-level BPE keeps its leading-space pieces); the pieces
are mapped back to words through their character offsets.

Scores: entity-level precision, recall and F1 (seqeval, micro-averaged over entity types,
the CoNLL evaluation script's rules; BILOU's L-/U- read as IOBES's E-/S-) and token (word)
accuracy; for a tag set that marks no entity chunks (parts of speech: NN, VBZ) word accuracy
alone, the metric of those benchmarks.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch.nn.functional as F

from lmforge.config.options import OptionsError
from lmforge.objectives.base import IGNORE, Loss
from lmforge.tasks.base import Task, notes, register

DOCSTART = "-DOCSTART-"


def decode_utf8(data: bytes, path) -> str:
    """`data` as text; a byte that is not UTF-8 is an error naming the file and line."""
    try:
        return data.decode("utf-8-sig")  # a BOM from a Windows editor is not part of the first word
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise OptionsError(f"{path}: line {line}: not valid UTF-8 (byte {data[err.start]:#04x}); "
                           f"save the file as UTF-8") from None


def read_conll(path: str | os.PathLike, tag_column: int = -1, word_column: int = 0) -> list:
    """Sentences of a CoNLL file (a word and its columns per line, a blank line between
    sentences, -DOCSTART- lines skipped) -> [{"words", "tags", "line"}], line = the first word's."""
    path = Path(path)
    text = decode_utf8(path.read_bytes(), path)
    records: list = []
    words: list = []
    tags: list = []
    first, width = 0, None  # width: (columns, line) of the first word line, which every line must match
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines: \x0b, \u2028 are not breaks here
        columns = line.split()
        if not columns or columns[0] == DOCSTART:
            if words:
                records.append({"words": words, "tags": tags, "line": first})
            words, tags = [], []
            continue
        if len(columns) < 2:
            raise OptionsError(f"{path}: line {number}: {line.strip()!r} has a word but no tag column")
        try:
            word, tag = columns[word_column], columns[tag_column]
        except IndexError:
            raise OptionsError(f"{path}: line {number}: {len(columns)} columns {line.strip()!r}, but the "
                               f"word is column {word_column} and the tag column {tag_column}") from None
        width = width or (len(columns), number)
        if len(columns) != width[0]:  # prose, CSV or JSON split at spaces, not CoNLL: refuse, never guess
            raise OptionsError(f"{path}: line {number}: {len(columns)} columns, but line {width[1]} has "
                               f"{width[0]}; CoNLL has the same columns (a word, its tag) on every line")
        first = first if words else number
        words.append(word)
        tags.append(tag)
    if words:
        records.append({"words": words, "tags": tags, "line": first})
    if not records:
        raise OptionsError(f"{path}: no sentences (expected a word and its tag per line)")
    return records


def word_spans(words: list) -> tuple:
    """The words joined by single spaces, and each word's (start, end) characters in that text."""
    spans, at = [], 0
    for w in words:
        spans.append((at, at + len(w)))
        at += len(w) + 1
    return " ".join(words), spans


def token_words(offsets: list, sequence_ids: list, spans: list, n_chars: int) -> list:
    """For each token, the index of the word its characters fall in (-1: a special token, or
    characters between words)."""
    word_at = [-1] * n_chars
    for w, (s, e) in enumerate(spans):
        word_at[s:e] = [w] * (e - s)
    out = []
    for (s, e), seq in zip(offsets, sequence_ids):
        # byte-level pieces may include the space before a word: take the first character in a word
        hit = next((word_at[c] for c in range(s, e) if word_at[c] >= 0), -1) if seq is not None else -1
        out.append(hit)
    return out


def continuation(tag: str, labels: list) -> str:
    """The tag of a word's later pieces under label_all: I-X for B-X (when I-X is a label)."""
    if tag.startswith("B-") and "I-" + tag[2:] in labels:
        return "I-" + tag[2:]
    return tag


def align(tokenizer, words: list, tags: list | None, labels: list, max_len: int,
          label_all: bool = False) -> dict:
    """Encode one sentence: input ids, segment ids, each token's word ("word_ids", -1 for
    none) and, with tags, "labels" (label index on first pieces, IGNORE elsewhere)."""
    text, spans = word_spans(words)
    enc = tokenizer.encode(text, max_length=max_len)
    word_ids = token_words(enc.offsets, enc.sequence_ids, spans, len(text))
    example = {"input_ids": enc.ids, "segment_ids": enc.segment_ids, "word_ids": word_ids}
    if tags is None:
        return example
    index = {label: i for i, label in enumerate(labels)}
    out, previous = [], -1
    for w in word_ids:
        if w < 0:
            out.append(IGNORE)
        elif w != previous:
            out.append(index[tags[w]])
        else:
            out.append(index[continuation(tags[w], labels)] if label_all else IGNORE)
        previous = w
    example["labels"] = out
    return example


def word_tags(word_ids: list, predicted: list, labels: list, n_words: int) -> list:
    """One tag per word: the prediction at its first piece; None for a word the model did not read (cut
    past max_len, or no pieces), which a caller would otherwise take for a prediction of "O"."""
    tags = [None] * n_words
    for w, p in zip(word_ids, predicted):
        if w >= 0 and tags[w] is None:
            tags[w] = labels[p]
    return tags


CHUNK_PREFIXES = ("B-", "I-", "E-", "S-", "L-", "U-")  # IOB1/2, IOBES, BILOU (as IOBES)


def is_chunked(tags: list) -> bool:
    """Whether tags mark entity chunks: each "O" or a prefixed chunk tag (B-X, I-X, ...), some not "O"."""
    return all(t == "O" or t.startswith(CHUNK_PREFIXES) for t in tags) and any(t != "O" for t in tags)


def _check_tags(gold: list, predicted: list) -> None:
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predictions")
    if not gold:
        raise ValueError("no sentences to score")
    for i, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")


def word_accuracy(gold: list, predicted: list) -> float:
    """Share of words whose predicted tag is the gold tag (seqeval's accuracy_score)."""
    _check_tags(gold, predicted)
    words = sum(len(g) for g in gold)
    return sum(a == b for g, p in zip(gold, predicted) for a, b in zip(g, p)) / max(words, 1)


BILOU_AS_IOBES = {"L-": "E-", "U-": "S-"}  # the same chunk rules under the names seqeval's default mode reads


def as_iobes(tags: list) -> list:
    """Tag sequences with BILOU's L-X / U-X written as IOBES's E-X / S-X (other tags unchanged)."""
    return [[BILOU_AS_IOBES.get(t[:2], t[:2]) + t[2:] for t in seq] for seq in tags]


def entity_scores(gold: list, predicted: list) -> dict:
    """Entity-level F1 (primary), precision, recall (seqeval, micro over types) and word accuracy
    of tag sequences; BILOU tags are scored as their IOBES names."""
    from seqeval.metrics import f1_score, precision_score, recall_score

    accuracy = word_accuracy(gold, predicted)
    # seqeval's default (conlleval) mode knows B/I/E/S but not L/U: it would join two adjacent U-PER
    # entities into one and take B-PER L-PER for one, scoring a wrong split as right
    gold, predicted = as_iobes(gold), as_iobes(predicted)
    return {"f1": float(f1_score(gold, predicted, zero_division=0)),
            "precision": float(precision_score(gold, predicted, zero_division=0)),
            "recall": float(recall_score(gold, predicted, zero_division=0)),
            "accuracy": accuracy}


def tag_scores(gold: list, predicted: list, labels: list) -> dict:
    """entity_scores where the tag set `labels` marks chunks; word accuracy alone otherwise. A word not
    read (None) is scored as tagged "O": its gold entity is missed, not left out of the count."""
    predicted = [[t if t is not None else "O" for t in tags] for tags in predicted]
    if is_chunked(labels):
        return entity_scores(gold, predicted)
    # Parts of speech (NN, VBZ): seqeval would read NN as an entity of type "N" and report an
    # entity F1 that means nothing; the benchmarks' metric for such tags is word accuracy.
    return {"accuracy": word_accuracy(gold, predicted)}


def tag_set(records: list) -> list:
    """The sorted tags of `records` (the label list of a tagging task)."""
    return sorted({t for r in records for t in r["tags"]})


@register
class TaggingTask(Task):
    """A tag per word (BIO named entities, parts of speech), from the first piece of each word."""

    kind = "tagging"
    options = ("label_all",)
    head = "token-classification"
    meta_keys = ("word_ids",)
    unread = 0  # words of the last encode_all that no token reads: cut past max_len, or no pieces (say_cut)

    def __init__(self, model, tokenizer, labels: list | None = None, max_len: int = 128,
                 label_all: bool = False) -> None:
        if not labels:
            raise ValueError("a tagging task needs its tag set (labels), e.g. tag_set(train_records)")
        super().__init__(model, tokenizer, labels, max_len)
        self.label_all = label_all

    def head_args(self) -> dict:
        """The token-classification head predicts one of the tags."""
        return {"n_labels": len(self.labels)}

    def encode(self, record: dict) -> list:
        """One sentence -> one example (truncated to max_len tokens); unknown tags are errors."""
        words, tags = record["words"], record.get("tags")
        if tags is not None:
            if len(tags) != len(words):
                raise ValueError(f"line {record.get('line')}: {len(words)} words but {len(tags)} tags")
            unseen = sorted(set(tags) - set(self.labels))
            if unseen:
                raise ValueError(f"line {record.get('line')}: tag(s) {unseen} not in the training tags "
                                 f"{self.labels}")
        example = align(self.tokenizer, words, tags, self.labels, self.max_len, self.label_all)
        if len(example["input_ids"]) >= self.max_len and len(words) - 1 not in example["word_ids"]:
            self._was_cut = True  # its last words unread: tagged "O" (encode_all counts it)
        self.unread += len(words) - len({w for w in example["word_ids"] if w >= 0})
        return [example]

    def encode_all(self, records: list) -> list:
        """The base's examples; `unread` counts the words that no token reads (past max_len, or no pieces)."""
        self.unread = 0
        return super().encode_all(records)

    def say_cut(self, n: int, what: str, log=None) -> None:
        """The base's line on cut records, and one on the words left unread and how they count: the
        base's line alone did not say that a gold entity past the cut is scored as missed."""
        super().say_cut(n, what, log)
        if self.unread:
            how = ("are not learned from" if what == "training" else
                   "are predicted null and scored as tagged O (a gold entity there counts as missed)")
            notes(log)(
                f"{self.unread} words of the {n} {what} records are not read by the model (past "
                f"max_len={self.max_len} tokens, or no tokens for them): they {how}")

    def logits(self, batch: dict):
        """(B, T, n_labels) tag scores of a padded batch."""
        hidden = self.model(batch["input_ids"], batch["attention_mask"], segment_ids=batch.get("segment_ids"),
                            run_heads=False).last_hidden_state
        return self.task_head(hidden, batch["attention_mask"])

    def forward(self, batch: dict) -> Loss:
        """Cross-entropy over the labelled pieces."""
        logits = self.logits(batch)
        labels = batch["labels"]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)
        keep = labels != IGNORE
        accuracy = (logits.argmax(-1)[keep] == labels[keep]).float().mean()
        return Loss(loss, {"accuracy": accuracy.detach()})

    def predict(self, batch: dict) -> list:
        """The most likely tag index at every real position of each example."""
        best = self.logits(batch).argmax(-1)
        lengths = batch["attention_mask"].sum(1).tolist()
        return [row[:n] for row, n in zip(best.tolist(), lengths)]

    def decode(self, records: list, examples: list, outputs: list) -> list:
        """One tag list per record, a tag per word."""
        out: list = [None] * len(records)
        for example, predicted in zip(examples, outputs):
            i = example["record"]
            out[i] = word_tags(example["word_ids"], predicted, self.labels, len(records[i]["words"]))
        return out

    def score(self, records: list, predictions: list) -> dict:
        """Entity-level F1 (primary), precision, recall and word accuracy; word accuracy alone for
        tags that mark no entity chunks (parts of speech)."""
        return tag_scores([r["tags"] for r in records], predictions, self.labels)
