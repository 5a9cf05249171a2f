"""Task data: CSV / TSV / JSONL files with a column mapping (seq2seq: source and target texts), and
the built-in corpus's tasks, read into the canonical records of tasks/base.py (each with "line": its
line in the file).

Every problem is an error naming the file and the line: bytes that are not UTF-8, empty
lines or records, missing columns, rows of the wrong width, a CSV field over csv's limit (128 KiB),
a JSON list or object where text belongs, regression labels that are not finite numbers,
and (check_labels) validation labels that the training split never showed. A file that is
not of the task's kind (SQuAD JSON given to tagging, records without the task's fields) is
refused naming the fields it lacks, never read as garbage.

Labels of cls and pair are text: a string as written (surrounding spaces dropped), a JSON
number or boolean as JSON writes it (1 -> "1", true -> "true"). One file spelling a label two
ways (1 and "1", 1 and 1.0, "1" and "1.0", true and "true") is an error naming both spellings:
merging them could join two classes, keeping them apart could split one.
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from lmforge.utils.jsontext import loads

# canonical field -> its default column; "?" marks optional fields
FIELDS = {"cls": ("text", "label"), "pair": ("text", "text_pair", "label"),
          "regression": ("text", "text_pair?", "label"), "choice": ("text", "choices", "label"),
          "seq2seq": ("source", "target")}
GOLD = ("label", "target")  # the fields a file to predict on (labelled=False) may leave out
BUILTIN = {"sentiment": "cls", "entailment": "pair", "tagging": "tagging", "questions": "qa"}
BUILTIN_SIZE = (10, 10 ** 6)  # records of a built-in task, split 80/10/10: at least one in every split


def parse_columns(spec) -> dict:
    """"text=sentence,label=gold" (or a dict) -> {canonical field: column}; choices may join
    several columns with "+" (choices=ending0+ending1+ending2)."""
    if not spec:
        return {}
    if isinstance(spec, dict):
        return dict(spec)
    out = {}
    for part in str(spec).split(","):
        if "=" not in part:
            raise ValueError(f"--columns expects field=column pairs separated by commas, got {part!r}")
        field, column = (s.strip() for s in part.split("=", 1))
        out[field] = column
    return out


def read_text(path) -> str:
    """A file's text; bytes that are not UTF-8 are an error naming the line and column."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(f"{path}:{line}: not valid UTF-8 (byte {data[err.start]:#04x} at column {column}); "
                         f"save the file as UTF-8") from None


def read_rows(path) -> list:
    """(line, {column: value}) of every record of a .csv, .tsv or .jsonl file."""
    suffix = Path(path).suffix.lower()
    text = read_text(path)
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _jsonl_rows(path, text)
    if suffix in (".csv", ".tsv", ".txt"):
        return _delimited_rows(path, text, "," if suffix == ".csv" else "\t")
    raise ValueError(f"{path}: unknown task file type {suffix!r}; use .csv, .tsv or .jsonl")


def _jsonl_rows(path, text: str) -> list:
    rows, lines = [], text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    for n, line in enumerate(lines, 1):
        if not line.strip():
            raise ValueError(f"{path}:{n}: empty line (one JSON object per line)")
        try:
            row = loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n}: not valid JSON: {err.msg} (column {err.colno})") from None
        if not isinstance(row, dict) or not row:
            raise ValueError(f"{path}:{n}: empty record (expected a JSON object of fields)")
        rows.append((n, row))
    if not rows:
        raise ValueError(f"{path}: no records")
    return rows


def _delimited_rows(path, text: str, delimiter: str) -> list:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header, rows, end = None, [], 0
    for values in _records(path, reader):
        n, end = end + 1, reader.line_num  # a quoted field may span lines: a record starts after the last
        if not values or not any(v.strip() for v in values):
            raise ValueError(f"{path}:{n}: empty {'line' if not values else 'record'}")
        if header is None:
            header = [v.strip() for v in values]
            continue
        if len(values) != len(header):
            raise ValueError(f"{path}:{n}: {len(values)} fields, but the header (line 1) has {len(header)}")
        rows.append((n, dict(zip(header, values))))
    if not rows:
        raise ValueError(f"{path}: no records below the header")
    return rows


def _records(path, reader):
    """The reader's records; csv's own errors (a field over its 128 KiB limit, a NUL byte, an
    unclosed quote) as one line naming the file and the line."""
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            what = (f"a field longer than csv's limit of {csv.field_size_limit()} characters (128 KiB); use .jsonl "
                    f"for long texts" if "field limit" in str(err) else str(err))
            raise ValueError(f"{path}:{reader.line_num}: {what}") from None


def _field(path, n: int, row: dict, field: str, column: str, optional: bool = False):
    if column not in row:
        if optional:
            return None
        raise ValueError(f"{path}:{n}: no column {column!r} (for {field}); the record has "
                         f"{', '.join(map(repr, row))}; map one with --columns {field}=NAME")
    value = row[column]
    if optional and (value is None or value == ""):
        return None
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{path}:{n}: empty {field} (column {column!r})")
    return value


def _label(path, n: int, kind: str, value, choices=None):
    if kind == "regression":
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{path}:{n}: regression label {value!r} is not a number") from None
        if not math.isfinite(number):  # a NaN or infinite target makes every loss after it NaN
            raise ValueError(f"{path}:{n}: regression label {value!r} is not a finite number")
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
            raise ValueError(f"{path}:{n}: choice label {value!r} is not an index")
        if not 0 <= index < len(choices):
            raise ValueError(f"{path}:{n}: choice label {index} is outside the {len(choices)} choices")
        return index
    if isinstance(value, (list, dict)):
        raise ValueError(f"{path}:{n}: label {json.dumps(value)[:40]} is not a string, number or boolean")
    return str(value).strip() if isinstance(value, str) else json.dumps(value)


def _text(path, n: int, field: str, column: str, value) -> str:
    """A text field's value as text; a JSON list or object there is an error (str() would turn it
    into Python's spelling of it, silently)."""
    if isinstance(value, (list, dict)):
        raise ValueError(f"{path}:{n}: {field} (column {column!r}) must be text, got a JSON "
                         f"{'list' if isinstance(value, list) else 'object'} {json.dumps(value)[:40]}")
    return str(value)


def _spelling_check(path, n: int, raw, label: str, seen: dict) -> None:
    """A label spelled two ways in one file is an error naming both (see the module docstring);
    `seen` maps each label's value to its first spelling and line."""
    spelling = json.dumps(raw.strip() if isinstance(raw, str) else raw, ensure_ascii=False)
    try:
        number = float(label)  # "1", "1.0" and "01" are one value
    except ValueError:
        number = math.nan
    first, line = seen.setdefault(number if math.isfinite(number) else label, (spelling, n))
    if first != spelling:
        raise ValueError(f"{path}:{n}: label {spelling} is also spelled {first} (line {line}); labels are "
                         f"read as text, so write each label one way throughout the file")


def _choices(path, n: int, row: dict, column: str) -> list:
    if "+" in column:
        return [str(_field(path, n, row, "choices", c)) for c in column.split("+")]
    value = _field(path, n, row, "choices", column)
    if not isinstance(value, list) or not value:
        raise ValueError(f"{path}:{n}: choices (column {column!r}) must be a non-empty list; in CSV/TSV "
                         f"name the columns: --columns choices=ending0+ending1+...")
    return [_text(path, n, "choices", column, c) for c in value]


def read_records(path, kind: str, columns=None, labelled: bool = True) -> list:
    """Canonical records of a task file (kinds cls, pair, regression, choice, seq2seq; tagging and qa
    read their own formats, see read_task_file). labelled=False: the label (target) may be absent."""
    if kind not in FIELDS:
        raise ValueError(f"task {kind!r} has no CSV/JSONL reader; kinds: {', '.join(FIELDS)}")
    mapping = parse_columns(columns)
    names = [f.rstrip("?") for f in FIELDS[kind]]
    unknown = sorted(set(mapping) - set(names))
    if unknown:
        raise ValueError(f"--columns names unknown field(s) {unknown}; {kind} has {', '.join(names)}")
    records, seen = [], {}
    for n, row in read_rows(path):
        _require(path, n, row, kind, mapping, labelled)
        record = {"line": n}
        for spec in FIELDS[kind]:
            field = spec.rstrip("?")
            column = mapping.get(field, field)
            optional = spec.endswith("?") or (field in GOLD and not labelled)
            if field == "choices":
                record["choices"] = _choices(path, n, row, column)
                continue
            value = _field(path, n, row, field, column, optional)
            if field == "label" and value is not None:
                label = _label(path, n, kind, value, record.get("choices"))
                if kind in ("cls", "pair"):
                    _spelling_check(path, n, value, label, seen)
                value = label
            elif value is not None:
                value = _text(path, n, field, column, value)
            record[field] = value
        records.append(record)
    return records


def _require(path, n: int, row: dict, kind: str, mapping: dict, labelled: bool) -> None:
    """Every column the task needs is in the record: an error naming all it lacks."""
    needed = [(f, c) for f in FIELDS[kind] if not f.endswith("?") and (labelled or f not in GOLD)
              for c in mapping.get(f, f).split("+")]
    missing = [(f, c) for f, c in needed if c not in row]
    if len(missing) > 1:  # one missing column: _field names it with the way to map it
        columns, fields = ", ".join(repr(c) for _, c in missing), ", ".join(f for f, _ in missing)
        raise ValueError(f"{path}:{n}: no columns {columns} (for {fields}); the record has "
                         f"{', '.join(map(repr, row))}: is this a {kind} file? (--columns maps fields "
                         f"to columns)")


class Records(list):
    """Records read from one file, which they remember (`source`) so that an error about one of them,
    found later (an unknown label when encoding), can name the file and not just the line."""

    def __init__(self, records=(), source="") -> None:
        super().__init__(records)
        self.source = str(source)


def source_of(records, default: str) -> str:
    """The file `records` were read from (Records, as read_task_file returns), else `default`."""
    return getattr(records, "source", "") or default


def read_task_file(path, kind: str, columns=None, labelled: bool = True) -> Records:
    """Records of any task file: CoNLL (tagging) and SQuAD JSON (qa) by the span tasks' readers,
    JSONL of canonical records for those two, CSV/TSV/JSONL with a column mapping for the rest."""
    suffix = Path(path).suffix.lower()
    if kind == "tagging" and suffix != ".jsonl":
        from lmforge.tasks.tagging import read_conll

        _refuse_json(path)
        return Records(read_conll(path), path)
    if kind == "qa" and suffix != ".jsonl":
        from lmforge.tasks.qa import read_squad

        return Records(read_squad(path), path)
    if kind in ("tagging", "qa"):
        return Records(_canonical_jsonl(path, kind), path)
    return Records(read_records(path, kind, columns, labelled), path)


SPAN_FIELDS = {"tagging": ("words", "tags"), "qa": ("id", "question", "context", "answers")}


def _refuse_json(path) -> None:
    """A JSON document (SQuAD, a list of records) or JSON lines where a CoNLL file is read would
    split into nonsense words and tags: an error naming the fields a tagging record lacks."""
    text = read_text(path)
    first = next((line for line in text.split("\n") if line.strip()), "")
    for candidate in (text, first):
        try:
            data = loads(candidate)
        except json.JSONDecodeError:  # not JSON: CoNLL, as expected
            continue
        row = data[0] if isinstance(data, list) and data else data
        if isinstance(row, dict):
            missing = [k for k in SPAN_FIELDS["tagging"] if k not in row]
            fix = (f"it lacks {', '.join(map(repr, missing))}; give CoNLL (a word and its tag per line) or "
                   f".jsonl records of words and tags") if missing else "name a JSON lines file .jsonl"
            raise ValueError(f"{path}: JSON with fields {', '.join(map(repr, row)) or 'none'}, not a "
                             f"tagging file: {fix}")
        if isinstance(data, list):
            raise ValueError(f"{path}: a JSON list, not a tagging file (CoNLL: a word and its tag per line)")


def _canonical_jsonl(path, kind: str) -> list:
    need = SPAN_FIELDS[kind]
    records = []
    for n, row in read_rows(path):
        missing = [k for k in need if k not in row]
        if missing:
            raise ValueError(f"{path}:{n}: no field(s) {missing} (a {kind} record has {', '.join(need)})")
        record = {**{k: row[k] for k in need}, "line": n}
        (_check_tagging if kind == "tagging" else _check_qa)(f"{path}:{n}", record)
        records.append(record)
    return records


def _strings(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v.strip() for v in value)


def _check_tagging(where: str, record: dict) -> None:
    """words and tags: non-empty lists of strings, one tag per word."""
    for key in ("words", "tags"):
        if not _strings(record[key]):
            raise ValueError(f"{where}: {key} must be a non-empty list of non-blank strings, got "
                             f"{json.dumps(record[key], ensure_ascii=False)[:40]}")
    if len(record["words"]) != len(record["tags"]):
        raise ValueError(f"{where}: {len(record['words'])} words but {len(record['tags'])} tags")


def _check_qa(where: str, record: dict) -> None:
    """question and context: text; answers: [{"text", "start"}], each found at its start in the context."""
    for key in ("question", "context"):
        if not isinstance(record[key], str) or not record[key].strip():
            raise ValueError(f"{where}: {key} must be non-empty text")
    if not isinstance(record["id"], (str, int)) or isinstance(record["id"], bool):
        raise ValueError(f"{where}: id must be a string or an integer")
    record["id"] = str(record["id"])
    answers = record["answers"]
    shape = 'a list of {"text": ..., "start": character}'
    if not isinstance(answers, list):
        raise ValueError(f"{where}: answers must be {shape} ([] for none), got {json.dumps(answers)[:40]}")
    for k, a in enumerate(answers):
        if not (isinstance(a, dict) and isinstance(a.get("text"), str) and type(a.get("start")) is int):
            raise ValueError(f"{where}: answers[{k}] must be {{\"text\": ..., \"start\": character}}, got "
                             f"{json.dumps(a, ensure_ascii=False)[:40]}")
        found = record["context"][a["start"]:a["start"] + len(a["text"])]
        if a["start"] < 0 or found != a["text"]:
            raise ValueError(f"{where}: answers[{k}] {a['text']!r} is not at character {a['start']} of the "
                             f"context (found {found!r})")


def gold_given(records: list, source) -> bool:
    """Whether the records carry their gold answers (label, tags, answers or target): True when
    all do, False when none does; a mix is an error naming the first record without."""
    have = [any(r.get(g) is not None for g in ("label", "tags", "answers", "target")) for r in records]
    if all(have) or not any(have):
        return all(have)
    r, where = records[have.index(False)], source_of(records, source)
    raise ValueError(f"{where}:{r.get('line', '?')}: no label, though other records have one; label every "
                     f"record (to be scored) or none (for predictions only)")


def label_set(records: list) -> list:
    """The sorted labels of a training split."""
    return sorted({r["label"] for r in records if r.get("label") is not None})


def check_labels(records: list, labels: list, source) -> None:
    """Every record's label must be one of the training labels (an error naming the line)."""
    known, where = set(labels), source_of(records, source)
    for r in records:
        if r.get("label") is not None and r["label"] not in known:
            raise ValueError(f"{where}:{r.get('line', '?')}: label {r['label']!r} does not occur in the "
                             f"training data (labels: {', '.join(map(str, labels))})")


def builtin(name: str, n: int = 1000, seed: int = 0) -> tuple:
    """(kind, {"train", "validation", "test": canonical records}) of a built-in corpus task."""
    from lmforge.data.probes import tasks

    if name not in BUILTIN:
        raise ValueError(f"built-in task {name!r} is not one of {', '.join(BUILTIN)}")
    low, high = BUILTIN_SIZE
    if type(n) is not int or not low <= n <= high:
        raise ValueError(f"n: the records of a built-in task must be an integer in [{low}, {high}], "
                         f"got {n!r}")
    splits = tasks(n, seed)[name]
    convert = {"sentiment": lambda r: {"text": r["text"], "label": str(r["label"])},
               "entailment": lambda r: {"text": r["premise"], "text_pair": r["hypothesis"],
                                        "label": str(r["label"])},
               "tagging": lambda r: {"words": list(r["words"]), "tags": list(r["tags"])},
               "questions": lambda r: {"question": r["question"], "context": r["context"],
                                       "answers": [{"text": r["answer"], "start": r["start"]}]}}[name]
    out = {}
    for split, records in splits.items():
        out[split] = [{**({"id": f"{split}-{i}"} if name == "questions" else {}), **convert(r), "line": i}
                      for i, r in enumerate(records)]
    return BUILTIN[name], out
