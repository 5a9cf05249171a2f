"""One record's fields, checked and made canonical alike whether a task file holds it (tasks/formats.py)
or a Python caller passes it (`given_records`: lmforge.finetune's and evaluate's record lists).

Each error names where the record is: "FILE:LINE" for a file's, "train:N" (the N-th record, from 1) for
records given in Python, and the key at fault; it is an OptionsError whose field is the argument the
records came in ("train", "validation"; None for a file's). Labels of cls and pair become text (see
tasks/formats.py): the integer class ids of a Hugging Face dataset train as "0", "1", ..., as the same
labels read from a file do. A multilabel record's label is a list of such labels ([] for none; repeats
count once), in JSON lines or Python only. A text field's number or boolean is text as JSON writes it
(3 -> "3", true -> "true"), on every face.
"""
from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable
from contextlib import contextmanager

from lmforge.config.options import OptionsError, checked_text
from lmforge.tasks.base import task_class

# canonical field -> its default column; "?" marks optional fields
FIELDS = {"cls": ("text", "label"), "pair": ("text", "text_pair", "label"),
          "regression": ("text", "text_pair?", "label"), "choice": ("text", "choices", "label"),
          "multilabel": ("text", "text_pair?", "label"), "seq2seq": ("source", "target")}
GOLD = ("label", "target")  # the fields a file to predict on (labelled=False) may leave out
SPAN_FIELDS = {"tagging": ("words", "tags"), "qa": ("id", "question", "context", "answers")}
SHORTHAND = {"tagging": "words", "seq2seq": "source"}  # the field a record's "text" stands for (predict_form)
# the span fields records to predict on (labelled=False) may leave out: gold tags and answers, and the id
# a SQuAD file scores answers by; /predict takes these and GOLD, checked alike, and predicts without them
SPAN_GOLD = ("tags", "answers", "id")


class Records(list):
    """Records read from one file, which they remember (`source`) so that an error about one of them,
    found later (an unknown label when encoding), can name the file and not just the line; records given
    in Python remember the argument they came in (`field`: "train", given_records'), which such an error
    names, as the checks that made them named it (naming)."""

    def __init__(self, records=(), source="", field: str | None = None) -> None:
        super().__init__(records)
        self.source, self.field = str(source), field


def record_list(records, source: str) -> list:
    """Records given in Python as a list, read once: any iterable of them (a list, a generator, a Hugging
    Face datasets.Dataset, whose rows are dicts); an OptionsError naming `source` (the argument: "train",
    "validation") for text, a dict or None."""
    if isinstance(records, list):
        return records
    if isinstance(records, (str, bytes, dict)) or not isinstance(records, Iterable):
        raise OptionsError(f"{source}: a list of records (dicts of fields) is needed, got "
                           f"{type(records).__name__}", source)
    return list(records)


def training_records(kind: str, train) -> list:
    """Fine-tuning's `train` records read once (record_list), refused before any work where `kind` is no
    task's (an OptionsError naming kind) or there are none (naming train: an empty list had failed
    inside, as a task that "needs the list of labels")."""
    task_class(kind)
    train = record_list(train, "train")
    if not train:
        raise OptionsError("train: no records (an empty list): fine-tuning needs at least one", "train")
    return train


def given_records(records, kind: str | None, source: str, labelled: bool = True) -> Records:
    """Records passed in Python (dicts of the canonical fields, tasks/base.py) checked and made canonical
    as a task file's are, so that Python accepts and refuses what the command line does; errors name
    `source` ("train") and the record's "line", else its number from 1, and so does a later error about one
    of them (Records.field). Records read from a file (Records) are returned as they are; those of a kind
    whose task checks its own as it encodes them (rerank), or of no kind known (None), only listed."""
    checked_here = kind in FIELDS or kind in SPAN_FIELDS
    if isinstance(records, Records) and (records.source or not checked_here):  # a file's, or made here
        return records  # (records only listed, of no kind known then, are checked once the kind is)
    rows = []
    with naming(source):
        for n, row in enumerate(record_list(records, source), 1):
            if checked_here and not labelled:  # records to predict on take /predict's shorthands
                row = predict_form(kind, row, f"{source}:{n}", source)
            if not isinstance(row, dict) or not row:  # a rerank record "abc" failed inside the task
                raise OptionsError(f"{source}:{n}: a record is a dict of fields, got {str(row)[:40]!r}")
            # a record that says its own line (a file's, read before; the built-in tasks') keeps it
            rows.append((row["line"] if type(row.get("line")) is int else n, row))
        if not checked_here:  # only listed, each with its line: its task checks it as it encodes it
            return Records([{**row, "line": line} for line, row in rows], field=source)
        if kind in SPAN_FIELDS:
            rows = span_rows(rows, source, kind, labelled)
        else:
            rows = canonical_rows(rows, source, kind, {}, labelled, hint=False)
    return Records(rows, source, source)


def as_record(item):
    """A record to predict on given as a bare string: {"text": it}; anything else as it is."""
    return {"text": item} if isinstance(item, str) else item


def predict_form(kind: str, item, where: str, field: str | None = None):
    """A record to predict on (/predict's, evaluate's in Python) with its shorthands spelled out: a bare
    string is {"text": it}; a tagging record's text is its words (split at white space), a seq2seq
    record's text its source. Refused naming `where`: a text given with the field it stands for (an
    OptionsError whose field is `field`, the argument the record came in; else `where`)."""
    item = as_record(item)
    short = SHORTHAND.get(kind)
    if not isinstance(item, dict) or short is None or "text" not in item and short in item:
        return item
    with naming(where if field is None else field):
        if ("text" in item) == (short in item):
            raise OptionsError(f"{where}: a {kind} record has text or {short} (one of them)")
        text = as_text(item["text"], f"{where}: text")
        if text is None or blank(text):
            raise OptionsError(f"{where}: text must be non-empty text")
    rest = {k: v for k, v in item.items() if k != "text"}
    return {**rest, short: text.split() if kind == "tagging" else text}


@contextmanager
def naming(field: str | None):
    """Inside it, a record check's OptionsError (raised without a field) names `field`: the argument the
    records came in ("train", "validation"), as the Records made of them remember it (Records.field)."""
    try:
        yield
    except OptionsError as err:
        if err.field is None:
            err.field = field
        raise


def canonical_rows(rows, path, kind: str, mapping: dict, labelled: bool, hint: bool = True) -> list:
    """The canonical records of (line, {column: value}) rows of task `kind` (FIELDS) read from `path`,
    `mapping` naming the column of each field that is not under its own name (a file's --columns);
    labelled=False: the label (target) may be absent. hint=False: errors say nothing of --columns (the
    records came from Python, not from a file's columns: given_records names their argument)."""
    records, seen = [], {}
    for n, row in rows:
        _require(f"{path}:{n}", row, kind, mapping, labelled, hint)
        record = {"line": n}
        for spec in FIELDS[kind]:
            name = spec.rstrip("?")
            column = mapping.get(name, name)
            optional = spec.endswith("?") or (name in GOLD and not labelled)
            if name == "choices":
                record["choices"] = _choices(f"{path}:{n}", row, column, hint)
                continue
            value = _field(f"{path}:{n}", row, name, column, optional, hint)
            if name == "label" and value is not None:
                label = _label(f"{path}:{n}", kind, value, record.get("choices"))
                if kind in ("cls", "pair"):
                    _spelling_check(path, n, value, label, seen)
                value = label
            elif value is not None:
                value = _text(f"{path}:{n}", name, column, value)
            record[name] = value
        records.append(record)
    return records


def span_rows(rows, path, kind: str, labelled: bool = True) -> list:
    """The canonical records of tagging (words, tags) or qa (id, question, context, answers) rows;
    labelled=False: the tags (a qa record's answers and id) may be absent."""
    need = SPAN_FIELDS[kind]
    records = []
    for n, row in rows:
        missing = [k for k in need if k not in row and (labelled or k not in SPAN_GOLD)]
        if missing:
            raise OptionsError(f"{path}:{n}: no field(s) {missing} (a {kind} record has "
                               f"{', '.join(need)})")
        record = {**{k: row[k] for k in need if k in row}, "line": n}
        (_check_tagging if kind == "tagging" else _check_qa)(f"{path}:{n}", record)
        records.append(record)
    return records


def _field(where: str, row: dict, field: str, column: str, optional: bool = False, hint: bool = True):
    if column not in row:
        if optional:
            return None
        if not hint:  # Python's record: its fields are named as they are, no columns to map
            raise OptionsError(f"{where}: no field {field!r}; the record has {', '.join(map(repr, row))}")
        raise OptionsError(f"{where}: no column {column!r} (for {field}); the record has "
                            f"{', '.join(map(repr, row))}; map one with columns='{field}=NAME' (--columns "
                            f"{field}=NAME)")
    value = row[column]
    if optional and absent(value):
        return None
    if blank(value):
        raise OptionsError(f"{where}: empty {field} (column {column!r})")
    return value


def absent(value) -> bool:
    """Whether an optional text field's value means no field at all (None or ""): a regression record's
    text_pair "" is read without a pair, never as a pair of no tokens."""
    return value is None or value == ""


def blank(value) -> bool:
    """Whether a text field's value holds nothing to read (None, or only white space): refused."""
    return value is None or (isinstance(value, str) and not value.strip())


def optional_field(kind: str, field: str) -> bool:
    """Whether `field` is an optional text field of a `kind` record (FIELDS' "?")."""
    return f"{field}?" in FIELDS.get(kind, ())


def _label(where: str, kind: str, value, choices=None):
    if kind == "regression":
        try:  # float() would read true as 1.0 and "1_000" (Python's digit groups) as 1000.0
            number = float(value) if not isinstance(value, bool) and "_" not in str(value) else None
        except (TypeError, ValueError):
            number = None
        if number is None:
            raise OptionsError(f"{where}: regression label {value!r} is not a number")
        if not math.isfinite(number):  # a NaN or infinite target makes every loss after it NaN
            raise OptionsError(f"{where}: regression label {value!r} is not a finite number")
        return number
    if kind == "choice":
        # an index: a JSON integer (1.0 too) or CSV digits; int() would cut 1.7 to 1, take true as 1 and
        # overflow on Infinity
        whole = isinstance(value, float) and math.isfinite(value) and value.is_integer()
        try:
            index = int(value) if whole or isinstance(value, str) or type(value) is int else None
        except ValueError:
            index = None
        if index is None:
            raise OptionsError(f"{where}: choice label {value!r} is not an index")
        if not 0 <= index < len(choices):
            raise OptionsError(f"{where}: choice label {index} is outside the {len(choices)} choices")
        return index
    if kind == "multilabel":
        return _label_list(where, value)
    return _label_text(where, value)


def _label_list(where: str, value) -> list:
    """A multilabel record's labels: a list of labels, each made text as a cls label, repeats dropped."""
    if not isinstance(value, list):
        raise OptionsError(f"{where}: multilabel label {json.dumps(value, default=str)[:40]} is not a list "
                           f"of labels ([] for none; a CSV cell holds no list: give JSON lines)")
    labels = [_label_text(f"{where}: label[{i}]", v) for i, v in enumerate(value)]
    if "" in labels:
        raise OptionsError(f"{where}: label[{labels.index('')}] is blank")
    return list(dict.fromkeys(labels))


def _label_text(where: str, value) -> str:
    """A cls label as text: a string stripped, a number or boolean as JSON writes it."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool):
        return json.dumps(value)  # true, false
    # as JSON writes a number; NumPy's too (a dataset's class ids), which json.dumps refuses
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return json.dumps(float(value))
    shown = json.dumps(value, default=str)[:40]
    raise OptionsError(f"{where}: label {shown} is not a string, number or boolean")


def as_text(value, shown: str | None = None):
    """A text field's value as text, else None: a string as it is, a number or boolean as JSON writes it
    (3 -> "3", true -> "true"); a list, object or null is no text (str() would spell it as Python does).
    `shown` ("FILE:LINE: text"): a string that is not valid Unicode (a JSON "\\ud800") is an OptionsError
    saying so (checked_text's rule; its field left to `naming`), never met in the tokenizer."""
    if isinstance(value, str):
        return value if shown is None else checked_text(value, None, shown)
    if isinstance(value, (bool, numbers.Real)):  # NumPy's numbers too (a dataset's columns)
        return _label_text("", value)
    return None


def _text(where: str, field: str, column: str, value) -> str:
    """A text field's value as text (as_text); anything else is an error naming the field."""
    text = as_text(value, f"{where}: {field} (column {column!r})")
    if text is None:
        shown = json.dumps(value, ensure_ascii=False, default=str)[:40]
        raise OptionsError(f"{where}: {field} (column {column!r}) must be text (a string or number), got "
                            f"{shown}")
    return text


def _spelling_check(path, n: int, raw, label: str, seen: dict) -> None:
    """A label spelled two ways in one file is an error naming both (see tasks/formats.py's doc);
    `seen` maps each label's value to its first spelling and line."""
    spelling = label if not isinstance(raw, str) else json.dumps(raw.strip(), ensure_ascii=False)
    try:
        number = float(label)  # "1", "1.0" and "01" are one value
    except ValueError:
        number = math.nan
    first, line = seen.setdefault(number if math.isfinite(number) else label, (spelling, n))
    if first != spelling:
        raise OptionsError(f"{path}:{n}: label {spelling} is also spelled {first} (line {line}); labels are "
                            f"read as text, so write each label one way throughout the file")


def _choices(where: str, row: dict, column: str, hint: bool) -> list:
    if "+" in column:
        return [_text(where, "choices", c, _field(where, row, "choices", c)) for c in column.split("+")]
    value = _field(where, row, "choices", column, hint=hint)
    if not isinstance(value, list) or not value:
        # the mapping beside its name on each door ("columns (--columns) choices=..." parted them)
        how = ("; in CSV/TSV name the columns: columns='choices=ending0+ending1+...' (--columns "
               "choices=ending0+ending1+...)") if hint else ""
        raise OptionsError(f"{where}: choices (column {column!r}) must be a non-empty list{how}")
    choices = [_text(where, f"choices[{k}]", column, c) for k, c in enumerate(value)]
    if any(blank(c) for c in choices):  # a choice of nothing to read, refused as a blank text is
        raise OptionsError(f"{where}: choices[{[blank(c) for c in choices].index(True)}] (column {column!r}) "
                            f"is empty")
    return choices


def _require(where: str, row: dict, kind: str, mapping: dict, labelled: bool, hint: bool) -> None:
    """Every column the task needs is in the record: an error naming all it lacks."""
    needed = [(f, c) for f in FIELDS[kind] if not f.endswith("?") and (labelled or f not in GOLD)
              for c in mapping.get(f, f).split("+")]
    missing = [(f, c) for f, c in needed if c not in row]
    if len(missing) > 1:  # one missing column: _field names it with the way to map it
        columns, fields = ", ".join(repr(c) for _, c in missing), ", ".join(f for f, _ in missing)
        if not hint:
            raise OptionsError(f"{where}: no fields {columns}; the record has {', '.join(map(repr, row))}: "
                                f"is this a {kind} record?")
        pairs = ",".join(f"{f}=NAME" for f in dict.fromkeys(f for f, _ in missing))  # as one column's hint
        # an optional field left unmapped is read as absent: a pair file's second text would go unread
        also = "".join(f", and {f[:-1]}=NAME where the records have one" for f in FIELDS[kind]
                       if f.endswith("?") and mapping.get(f[:-1], f[:-1]) not in row)
        raise OptionsError(f"{where}: no columns {columns} (for {fields}); the record has "
                            f"{', '.join(map(repr, row))}: if this is a {kind} file, map them with "
                            f"columns='{pairs}' (--columns {pairs}){also}")


def strings(value) -> bool:
    """Whether `value` is a non-empty list of non-blank strings (a tagging record's words and tags)."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v.strip() for v in value)


def _check_tagging(where: str, record: dict) -> None:
    """words and tags (where given): non-empty lists of strings, one tag per word."""
    for key in ("words", "tags"):
        if key in record and not strings(record[key]):
            raise OptionsError(f"{where}: {key} must be a non-empty list of non-blank strings, got "
                                f"{json.dumps(record[key], ensure_ascii=False, default=str)[:40]}")
    if "tags" in record and len(record["words"]) != len(record["tags"]):
        raise OptionsError(f"{where}: {len(record['words'])} words but {len(record['tags'])} tags")


def _check_qa(where: str, record: dict) -> None:
    """question and context: text; answers: [{"text", "start"}], each found at its start in the context."""
    for key in ("question", "context"):
        record[key] = as_text(record[key], f"{where}: {key}")  # a number is text, as in any other text field
        if record[key] is None or not record[key].strip():
            raise OptionsError(f"{where}: {key} must be non-empty text")
    if "id" in record:
        if not isinstance(record["id"], (str, int)) or isinstance(record["id"], bool):
            raise OptionsError(f"{where}: id must be a string or an integer")
        record["id"] = str(record["id"])
    if "answers" not in record:  # a record to predict on
        return
    answers = record["answers"]
    shape = 'a list of {"text": ..., "start": character}'
    if not isinstance(answers, list):
        raise OptionsError(f"{where}: answers must be {shape} ([] for none), got "
                            f"{json.dumps(answers, default=str)[:40]}")
    for k, a in enumerate(answers):
        if not (isinstance(a, dict) and isinstance(a.get("text"), str) and type(a.get("start")) is int):
            raise OptionsError(f"{where}: answers[{k}] must be {{\"text\": ..., \"start\": character}}, got "
                                f"{json.dumps(a, ensure_ascii=False, default=str)[:40]}")
        found = record["context"][a["start"]:a["start"] + len(a["text"])]
        if a["start"] < 0 or found != a["text"]:
            raise OptionsError(f"{where}: answers[{k}] {a['text']!r} is not at character {a['start']} of the "
                                f"context (found {found!r})")
