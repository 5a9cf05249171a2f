"""Task data: CSV / TSV / JSONL files with a column mapping (seq2seq: source and target texts), and
the built-in corpus's tasks, read into the canonical records of tasks/base.py (each with "line": its
line in the file).

Every problem is an error naming the file and the line: bytes that are not UTF-8, empty
lines or records, missing columns, rows of the wrong width, non-numeric regression labels,
and (check_labels) validation labels that the training split never showed.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

# canonical field -> its default column; "?" marks optional fields
FIELDS = {"cls": ("text", "label"), "pair": ("text", "text_pair", "label"),
          "regression": ("text", "text_pair?", "label"), "choice": ("text", "choices", "label"),
          "seq2seq": ("source", "target")}
GOLD = ("label", "target")  # the fields a file to predict on (labelled=False) may leave out
BUILTIN = {"sentiment": "cls", "entailment": "pair", "tagging": "tagging", "questions": "qa"}


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
            row = json.loads(line)
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
    for values in reader:
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
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{path}:{n}: regression label {value!r} is not a number") from None
    if kind == "choice":
        try:
            index = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{path}:{n}: choice label {value!r} is not an index") from None
        if not 0 <= index < len(choices):
            raise ValueError(f"{path}:{n}: choice label {index} is outside the {len(choices)} choices")
        return index
    return str(value).strip() if isinstance(value, str) else json.dumps(value)


def _choices(path, n: int, row: dict, column: str) -> list:
    if "+" in column:
        return [str(_field(path, n, row, "choices", c)) for c in column.split("+")]
    value = _field(path, n, row, "choices", column)
    if not isinstance(value, list) or not value:
        raise ValueError(f"{path}:{n}: choices (column {column!r}) must be a non-empty list; in CSV/TSV "
                         f"name the columns: --columns choices=ending0+ending1+...")
    return [str(c) for c in value]


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
    records = []
    for n, row in read_rows(path):
        record = {"line": n}
        for spec in FIELDS[kind]:
            field = spec.rstrip("?")
            column = mapping.get(field, field)
            optional = spec.endswith("?") or (field in GOLD and not labelled)
            if field == "choices":
                record["choices"] = _choices(path, n, row, column)
                continue
            value = _field(path, n, row, field, column, optional)
            if field == "label":
                value = None if value is None else _label(path, n, kind, value, record.get("choices"))
            elif value is not None:
                value = str(value)
            record[field] = value
        records.append(record)
    return records


def read_task_file(path, kind: str, columns=None, labelled: bool = True) -> list:
    """Records of any task file: CoNLL (tagging) and SQuAD JSON (qa) by the span tasks' readers,
    JSONL of canonical records for those two, CSV/TSV/JSONL with a column mapping for the rest."""
    suffix = Path(path).suffix.lower()
    if kind == "tagging" and suffix != ".jsonl":
        from lmforge.tasks.tagging import read_conll

        return read_conll(path)
    if kind == "qa" and suffix != ".jsonl":
        from lmforge.tasks.qa import read_squad

        return read_squad(path)
    if kind in ("tagging", "qa"):
        return _canonical_jsonl(path, kind)
    return read_records(path, kind, columns, labelled)


def _canonical_jsonl(path, kind: str) -> list:
    need = ("words", "tags") if kind == "tagging" else ("id", "question", "context", "answers")
    records = []
    for n, row in read_rows(path):
        missing = [k for k in need if k not in row]
        if missing:
            raise ValueError(f"{path}:{n}: no field(s) {missing} (a {kind} record has {', '.join(need)})")
        records.append({**{k: row[k] for k in need}, "line": n})
    return records


def label_set(records: list) -> list:
    """The sorted labels of a training split."""
    return sorted({r["label"] for r in records if r.get("label") is not None})


def check_labels(records: list, labels: list, source) -> None:
    """Every record's label must be one of the training labels (an error naming the line)."""
    known = set(labels)
    for r in records:
        if r.get("label") is not None and r["label"] not in known:
            raise ValueError(f"{source}:{r.get('line', '?')}: label {r['label']!r} does not occur in the "
                             f"training data (labels: {', '.join(map(str, labels))})")


def builtin(name: str, n: int = 1000, seed: int = 0) -> tuple:
    """(kind, {"train", "validation", "test": canonical records}) of a built-in corpus task."""
    from lmforge.data.probes import tasks

    if name not in BUILTIN:
        raise ValueError(f"built-in task {name!r} is not one of {', '.join(BUILTIN)}")
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
