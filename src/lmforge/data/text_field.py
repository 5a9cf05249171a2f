"""Whether JSONL corpus files hold their text in the field they are read by, told before a job reads them:
files none of whose records has it give no text, which the reader would say in two warnings and the job in
an error repeating them, none naming the fields the records do have."""
from __future__ import annotations

from pathlib import Path

from lmforge.config.options import OptionsError
from lmforge.data.openers import open_binary
from lmforge.data.read_options import ReadOptions
from lmforge.utils.jsontext import loads

MAX_LINE = 1 << 20  # a longer record is left to the reader (which reads it in pieces), not held here
MAX_FIELDS = 8  # the records' field names said at most
HINT = "give text_field (read=ReadOptions(text_field=...)), the field that holds the text"


def missing_text_field(path, options: ReadOptions | None = None) -> str | None:
    """"FILE: no record has ... (its records' fields: ...)" where `path` is a JSONL file none of whose
    records has a string text field (`options.text_field`); None where one has, where it is no JSONL file,
    or holds no JSON object (the reader's warnings say what it holds). Stops at the first record that has
    it, so a good file costs one line."""
    options, path = options or ReadOptions(), Path(path)
    if not path.is_file() or options.format_of(path) != "jsonl":
        return None
    fields: dict = {}
    with open_binary(path) as handle:
        while line := handle.readline(MAX_LINE):
            if len(line) == MAX_LINE and not line.endswith(b"\n"):
                return None
            try:
                record = loads(line.decode("utf-8", "replace"))
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get(options.text_field), str):
                return None
            fields.update(dict.fromkeys(record) if isinstance(record, dict) else {})
    if not fields:
        return None
    names = ", ".join(list(fields)[:MAX_FIELDS]) + (", ..." if len(fields) > MAX_FIELDS else "")
    return f"{path}: no record has a string \"{options.text_field}\" field (its records' fields: {names})"


def missing_everywhere(files, options: ReadOptions | None = None) -> str | None:
    """missing_text_field's message for the first of `files` where every one of them (files named, not
    folders) lacks the text field, so that nothing would be read; None otherwise."""
    said = [missing_text_field(f, options) for f in files or () if f is not None]
    return said[0] if said and all(said) else None


class NoTextField(OptionsError):
    """JSONL data none of whose records has the text field; `.missing` says the file and its records'
    fields without the hint, for a face that names the field its own way (a command line: its flags)."""

    def __init__(self, missing: str, hint: str = HINT) -> None:
        super().__init__(f"{missing}: {hint}", "text_field")
        self.missing, self.hint = missing, hint

    def __reduce__(self):  # copied or pickled from its parts: from its message, the hint was said twice
        return type(self), (self.missing, self.hint)


def check_text_field(files, options: ReadOptions | None = None, hint: str = HINT) -> None:
    """A NoTextField (an OptionsError) naming the file, its records' fields and text_field where every one
    of `files` lacks the text field (missing_everywhere), with `hint` (how the caller names the field). The
    one check, before any model is built: pretrain()'s (which `lmforge pretrain` says with its flags)."""
    missing = missing_everywhere(files, options)
    if missing:
        raise NoTextField(missing, hint)
