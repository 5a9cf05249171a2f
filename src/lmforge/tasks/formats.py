"""Task data: CSV / TSV / JSONL files with a column mapping (seq2seq: source and target texts), and
the built-in corpus's tasks, read into the canonical records of tasks/base.py (each with "line": its
line in the file; each record's fields are checked by tasks/fields.py, as records given in Python are).

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
from pathlib import Path

from lmforge.config.options import OptionsError
from lmforge.tasks.fields import FIELDS, SPAN_FIELDS, Records, canonical_rows, span_rows
from lmforge.utils.atomic import atomic_write_text
from lmforge.utils.jsontext import loads

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
            raise OptionsError(f"columns (--columns) expects field=column pairs separated by commas, got "
                               f"{part!r}", "columns")
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
        raise OptionsError(f"{path}:{line}: not valid UTF-8 (byte {data[err.start]:#04x} at column "
                           f"{column}); save the file as UTF-8") from None


def read_rows(path) -> list:
    """(line, {column: value}) of every record of a .csv, .tsv or .jsonl file."""
    suffix = Path(path).suffix.lower()
    text = read_text(path)
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _jsonl_rows(path, text)
    if suffix in (".csv", ".tsv", ".txt"):
        return _delimited_rows(path, text, "," if suffix == ".csv" else "\t")
    raise OptionsError(f"{path}: unknown task file type {suffix!r}; use .csv, .tsv or .jsonl")


def _jsonl_rows(path, text: str) -> list:
    rows, lines = [], text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    for n, line in enumerate(lines, 1):
        if not line.strip():
            raise OptionsError(f"{path}:{n}: empty line (one JSON object per line)")
        try:
            row = loads(line, unique_keys=True)  # a second "label" would win, unsaid
        except json.JSONDecodeError as err:
            raise OptionsError(f"{path}:{n}: not valid JSON: {err.msg} (column {err.colno})") from None
        if not isinstance(row, dict) or not row:  # a list or a number is no record, and no empty one
            what = "empty record" if row == {} else f"not a JSON object: {line.strip()[:40]}"
            raise OptionsError(f"{path}:{n}: {what} (expected a JSON object of fields)")
        rows.append((n, row))
    if not rows:
        raise OptionsError(f"{path}: no records")
    return rows


def _delimited_rows(path, text: str, delimiter: str) -> list:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header, rows, end = None, [], 0
    for values in _records(path, reader):
        n, end = end + 1, reader.line_num  # a quoted field may span lines: a record starts after the last
        if not values or not any(v.strip() for v in values):
            raise OptionsError(f"{path}:{n}: empty {'line' if not values else 'record'}")
        if header is None:
            header = _header(path, n, values)
            continue
        if len(values) != len(header):
            raise OptionsError(f"{path}:{n}: {len(values)} fields, but the header (line 1) has {len(header)}")
        rows.append((n, dict(zip(header, values))))
    if not rows:
        raise OptionsError(f"{path}: no records below the header")
    return rows


def _header(path, n: int, values: list) -> list:
    """A CSV/TSV header's column names; one named twice is an error naming both positions (a record read
    as a dict would keep the last, and a task would silently read the wrong column)."""
    header = [v.strip() for v in values]
    for k, name in enumerate(header):
        if name and header.index(name) != k:
            raise OptionsError(f"{path}:{n}: column {name!r} is named twice in the header (columns "
                               f"{header.index(name) + 1} and {k + 1}); give each column its own name")
    return header


def _records(path, reader):
    """The reader's records; csv's own errors (a field over its 128 KiB limit, a NUL byte, an
    unclosed quote) as one line naming the file and the line."""
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            what = (f"a field longer than csv's limit of {csv.field_size_limit()} characters (128 KiB); use "
                    f".jsonl for long texts" if "field limit" in str(err) else str(err))
            raise OptionsError(f"{path}:{reader.line_num}: {what}") from None


def read_records(path, kind: str, columns=None, labelled: bool = True) -> list:
    """Canonical records of a task file (kinds cls, pair, regression, multilabel, choice, seq2seq; tagging
    and qa read their own formats, see read_task_file). labelled=False: the label (target) may be absent."""
    if kind not in FIELDS:
        raise OptionsError(f"task {kind!r} has no CSV/JSONL reader; kinds: {', '.join(FIELDS)}", "kind")
    mapping = parse_columns(columns)
    names = [f.rstrip("?") for f in FIELDS[kind]]
    unknown = sorted(set(mapping) - set(names))
    if unknown:
        raise OptionsError(f"columns (--columns) names unknown field(s) {unknown}; {kind} has "
                           f"{', '.join(names)}", "columns")
    return canonical_rows(read_rows(path), path, kind, mapping, labelled)


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
        return Records(span_rows(read_rows(path), path, kind, labelled), path)
    return Records(read_records(path, kind, columns, labelled), path)


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
            raise OptionsError(f"{path}: JSON with fields {', '.join(map(repr, row)) or 'none'}, not a "
                               f"tagging file: {fix}")
        if isinstance(data, list):
            raise OptionsError(f"{path}: a JSON list, not a tagging file (CoNLL: a word and its tag per "
                               f"line)")


def gold_given(records: list, source, field: str | None = None) -> bool:
    """Whether the records carry their gold answers (label, tags, answers or target): True when
    all do, False when none does; a mix is an OptionsError naming the first record without (its field
    `field`, the argument the records came in, unless they are a file's: that message names the file), and
    so is no record at all."""
    if not records:  # nothing to score or predict: refused as an empty file is ("no examples to score" was)
        raise OptionsError(f"{source_of(records, source)}: no records (an empty list): nothing to evaluate",
                           field)
    # a bare string (a record to predict on, fields.predict_form) carries none
    have = [isinstance(r, dict) and any(r.get(g) is not None for g in ("label", "tags", "answers", "target"))
            for r in records]
    if all(have) or not any(have):
        return all(have)
    n, where = have.index(False), source_of(records, source)
    line = records[n].get("line", n + 1) if isinstance(records[n], dict) else n + 1
    raise OptionsError(f"{where}:{line}: no label, though other records have one; label every "
                       f"record (to be scored) or none (for predictions only)",
                       field if where == source else None)


def label_set(records: list) -> list:
    """The sorted labels of a training split."""
    return sorted({r["label"] for r in records if r.get("label") is not None})


def check_labels(records: list, labels: list, source, field: str | None = None) -> None:
    """Every record's label must be one of the training labels: else an OptionsError naming the line (its
    field `field`, the argument the records came in, unless they are a file's, as gold_given's)."""
    known, where = set(labels), source_of(records, source)
    for r in records:
        if r.get("label") is not None and r["label"] not in known:
            raise OptionsError(f"{where}:{r.get('line', '?')}: label {r['label']!r} does not occur in the "
                               f"training data (labels: {', '.join(map(str, labels))})",
                               field if where == source else None)


def builtin(name: str, n: int = 1000, seed: int = 0) -> tuple:
    """(kind, {"train", "validation", "test": canonical records}) of a built-in corpus task."""
    from lmforge.data.probes import tasks

    if name not in BUILTIN:
        raise OptionsError(f"built-in task {name!r} is not one of {', '.join(BUILTIN)}", "name")
    low, high = BUILTIN_SIZE
    if type(n) is not int or not low <= n <= high:
        raise OptionsError(f"n: the records of a built-in task must be an integer in [{low}, {high}], "
                           f"got {n!r}", "n")
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


def write_predictions(path, records: list, predictions: list) -> Path:
    """One JSON line per record: its line, the prediction and the gold label where known."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    gold = next((k for k in ("tags", "answers", "target") if records and k in records[0]), "label")
    lines = []
    for record, prediction in zip(records, predictions):
        row = {"line": record.get("line"), **({"id": record["id"]} if "id" in record else {}),
               "prediction": prediction}
        if record.get(gold) is not None:
            row["gold"] = record[gold]
        lines.append(json.dumps(row, ensure_ascii=False))
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path
