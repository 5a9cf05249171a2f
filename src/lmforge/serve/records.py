"""/predict's inputs as the canonical records of a task (tasks/formats.py FIELDS), checked here so a
missing field is a 422 naming it rather than an error inside the worker: by its path, as the schema's
errors name theirs (inputs.1.text; inputs.1 for the record as a whole; inputs where one record is sent).
A text's emptiness is judged by the rule lmforge evaluate applies to a record (tasks/fields.py): blank is
refused, an optional text given as "" is left out."""
from __future__ import annotations

from lmforge.serve.limits import RequestError
from lmforge.tasks.fields import (absent, as_record, as_text, blank, optional_field, predict_form,
                                   strings)

# kind -> (required fields, optional fields) of a record sent to /predict
FIELDS = {"cls": (("text",), ()), "pair": (("text", "text_pair"), ()),
          "regression": (("text",), ("text_pair",)), "choice": (("text", "choices"), ()),
          "multilabel": (("text",), ("text_pair",)),
          "tagging": ((), ("text", "words")), "qa": (("question", "context"), ()),
          "seq2seq": ((), ("text", "source"))}


def _refuse(where: str, message: str) -> RequestError:
    """422 naming the field at path `where` (inputs.0.text), the message led by it."""
    return RequestError(422, f"{where}: {message}", param=where)


def _check(kind: str, at: str, record: dict) -> dict:
    required, optional = FIELDS[kind]
    missing = [f for f in required if f not in record]
    unknown = sorted(set(record) - set(required) - set(optional))
    if missing or unknown:
        allowed = ", ".join(required + tuple(f"{f}?" for f in optional))
        problem = f"lacks {', '.join(missing)}" if missing else f"has unknown field(s) {', '.join(unknown)}"
        raise _refuse(f"{at}.{(missing or unknown)[0]}", f"a {kind} record {problem} (fields: {allowed})")
    record = {k: _value(kind, f"{at}.{k}", k, v) for k, v in record.items()}
    # an optional text given as "" is no field, as lmforge evaluate reads it (not a pair of no tokens)
    return {k: v for k, v in record.items() if not (optional_field(kind, k) and absent(v))}


def _value(kind: str, where: str, key: str, value):
    """A field's value read by evaluate's rules (tasks/fields.py): a number or boolean as text, as JSON
    writes it; a blank text refused, an optional one given as "" left for _check to drop."""
    if key == "words":  # the rule of a task file's words (tasks/fields.py): none of them blank
        if not strings(value):
            raise _refuse(where, f"{key} must be a non-empty list of non-blank strings")
        return value
    if key == "choices":
        if not isinstance(value, list) or not value:
            raise _refuse(where, f"{key} must be a non-empty list of texts")
        return [_value(kind, f"{where}.{k}", f"choices[{k}]", v) for k, v in enumerate(value)]
    if value is None and optional_field(kind, key):
        return None  # no field, as evaluate reads an optional null
    text = as_text(value)
    if text is None:
        raise _refuse(where, f"{key} must be text (a string or number)")
    if blank(text) and not (optional_field(kind, key) and absent(text)):
        raise _refuse(where, f"{key} is empty (or only white space): there is nothing to read")
    return text


def as_records(kind: str, inputs) -> list:
    """The request's inputs (a string, a record, or a list of them) as records of task `kind`."""
    listed = isinstance(inputs, list)
    out = []
    for i, item in enumerate(inputs if listed else [inputs]):
        at = f"inputs.{i}" if listed else "inputs"
        record = _check(kind, at, dict(as_record(item)))
        try:  # the shorthands evaluate's Python records take too (tasks/fields.py)
            out.append(predict_form(kind, record, at))
        except ValueError as err:
            raise RequestError(422, str(err), param=at) from None
    return out


def record_tokens(task, counts: list) -> int:
    """The tokens a record costs, from its record_texts' counts: QA's windows read the context tokens they
    share again (QATask.read_tokens), the other tasks read each text once."""
    return task.read_tokens(*counts) if task.kind == "qa" else sum(counts)


def record_texts(kind: str, record: dict) -> list:
    """The texts of a record whose tokens count against the limits."""
    if kind == "tagging":
        return [" ".join(record["words"])]
    if kind == "choice":
        return [record["text"], *record["choices"]]
    if kind == "qa":
        return [record["question"], record["context"]]
    if kind == "seq2seq":
        return [record["source"]]
    return [record["text"], *([record["text_pair"]] if "text_pair" in record else [])]
