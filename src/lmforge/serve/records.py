"""/predict's inputs as the canonical records of a task (tasks/fields.py FIELDS), checked here so a
missing field is a 422 naming it rather than an error inside the worker: by its path, as the schema's
errors name theirs (inputs.1.text; inputs.1 for the record as a whole; inputs where one record is sent).
A text's emptiness is judged by the rule lmforge evaluate applies to a record (tasks/fields.py): blank is
refused, an optional text given as "" is left out. A record's gold fields (label, tags, answers, target,
qa's id) are taken and checked as evaluate checks them, and left out of the record predicted on; a field no
record of the task has is refused (a request is a typed call: a misspelt field is no silent default)."""
from __future__ import annotations

import re

from lmforge.config.options import OptionsError
from lmforge.serve.limits import RequestError
from lmforge.tasks.fields import FIELDS as TASK_FIELDS
from lmforge.tasks.fields import (GOLD, SHORTHAND, SPAN_FIELDS, SPAN_GOLD, absent, as_record, as_text, blank,
                                   given_records, optional_field, predict_form, strings)


def _fields(kind: str) -> tuple:
    """(required, optional, gold) fields of a `kind` record sent to /predict, from the task's fields: a
    shorthand's field (tagging's words, seq2seq's source) is optional, as its "text" is (one of them)."""
    specs = TASK_FIELDS.get(kind) or SPAN_FIELDS[kind]
    names = tuple(s.rstrip("?") for s in specs)
    gold = tuple(f for f in names if f in GOLD + SPAN_GOLD)
    optional = tuple(s.rstrip("?") for s in specs if s.endswith("?"))
    required = tuple(f for f in names if f not in gold + optional)
    if kind in SHORTHAND:
        required = tuple(f for f in required if f != SHORTHAND[kind])
        optional = ("text", SHORTHAND[kind], *optional)
    return required, optional, gold


# kind -> (required, optional, gold) fields of a record sent to /predict
FIELDS = {kind: _fields(kind) for kind in (*TASK_FIELDS, *SPAN_FIELDS)}


def _refuse(where: str, message: str) -> RequestError:
    """422 naming the field at path `where` (inputs.0.text), the message led by it."""
    return RequestError(422, f"{where}: {message}", param=where)


def _check(kind: str, at: str, record: dict) -> dict:
    """The record's fields checked, its gold ones left out (_gold checks them)."""
    required, optional, gold = FIELDS[kind]
    missing = [f for f in required if f not in record]
    unknown = sorted(set(record) - set(required + optional + gold))
    if missing or unknown:
        allowed = ", ".join(required + tuple(f"{f}?" for f in optional + gold))
        # both, where both: a misspelt field (text_pairr) is why the one it spells is missing
        problem = " and ".join(([f"lacks {', '.join(missing)}"] if missing else [])
                               + ([f"has unknown field(s) {', '.join(unknown)}"] if unknown else []))
        raise _refuse(f"{at}.{(missing or unknown)[0]}", f"a {kind} record {problem} (fields: {allowed})")
    record = {k: _value(kind, f"{at}.{k}", k, v) for k, v in record.items() if k not in gold}
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
    try:  # a lone surrogate (JSON's "\\ud800"): evaluate's rule (checked_text), not the tokenizer's error
        text = as_text(value, key)
    except OptionsError as err:
        raise _refuse(where, str(err)) from None
    if text is None:
        raise _refuse(where, f"{key} must be text (a string or number)")
    if blank(text) and not (optional_field(kind, key) and absent(text)):
        raise _refuse(where, f"{key} is empty (or only white space): there is nothing to read")
    return text


def as_records(kind: str, inputs) -> list:
    """The request's inputs (a string, a record, or a list of them) as records of task `kind`."""
    listed = isinstance(inputs, list)
    out, given = [], []
    for i, item in enumerate(inputs if listed else [inputs]):
        at = f"inputs.{i}" if listed else "inputs"
        given.append(dict(as_record(item)))
        record = _check(kind, at, given[-1])
        try:  # the shorthands evaluate's Python records take too (tasks/fields.py)
            out.append(predict_form(kind, record, at))
        except ValueError as err:
            raise RequestError(422, str(err), param=at) from None
    _gold(kind, out, given, listed)
    return out


def _gold(kind: str, records: list, given: list, listed: bool) -> None:
    """The gold fields sent (`given`'s) checked by evaluate's rule (given_records, labelled=False), a field
    at a time over every record that has it (two spellings of one label are refused across records, as in
    evaluate's list): a 422 naming inputs.i.FIELD. The records predicted on never hold them."""
    for field in FIELDS[kind][2]:
        rows = [{**r, field: g[field], "line": i}
                for i, (r, g) in enumerate(zip(records, given)) if field in g]
        try:
            given_records(rows, kind, "inputs", labelled=False)
        except ValueError as err:
            found = re.fullmatch(r"inputs:(\d+): (.*)", str(err), re.DOTALL)
            i, message = found.groups() if found else (0, str(err))
            where = f"inputs.{i}.{field}" if listed else f"inputs.{field}"
            # "(line 0)": the other record of a label spelled two ways, by its path too
            message = re.sub(r"\(line (\d+)\)", r"(inputs.\1)", message)
            raise _refuse(where, message) from None


def record_tokens(task, counts: list) -> int:
    """The tokens a record's bound is checked on, from its record_texts' counts: QA's windows read the
    context tokens they share again (QATask.read_tokens), a choice record's longest (text, choice)
    sequence (each is read alone: choice_tokens pays for them all), the other tasks' each text once."""
    if task.kind == "qa":
        return task.read_tokens(*counts)
    return max(counts) if task.kind == "choice" else sum(counts)


def choice_tokens(counts: list, most: int) -> int:
    """What a choice record costs: each choice read with the text, padded to the longest of them (cut at
    `most`), as MultipleChoiceTask.collate batches them: a record of many choices costs each of them."""
    return len(counts) * min(max(counts), most)


def record_texts(task, record: dict) -> list:
    """The (text, text_pair) sequences of a record whose tokens count against the limits, as the task
    encodes them: a text-to-text or seq2seq task's source with its prefix, a pair as one sequence
    (its specials once), each choice with the text."""
    kind = task.kind
    if hasattr(task, "source"):  # Seq2SeqTask, text2text: the prefix is read too
        return [(task.source(record), None)]
    if kind == "tagging":
        return [(" ".join(record["words"]), None)]
    if kind == "choice":
        return [(record["text"], choice) for choice in record["choices"]]
    if kind == "qa":
        return [(record["question"], None), (record["context"], None)]
    return [(record["text"], record.get("text_pair"))]
