"""ReadOptions: how files become documents (data/corpus.py reads them so), one typed object for Python's
CorpusReader, shard_corpus and passages, and for `lmforge corpus shard`'s flags, which refuse alike."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from lmforge.config.options import OptionsError, check_options, option, refuse_changed

FORMATS, DOCUMENTS, ERRORS = ("auto", "text", "jsonl"), ("block", "file"), ("skip", "replace", "strict")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
MAX_CHARS = 1 << 30  # a document or sentence held whole in memory at most (4 bytes a character: 4 GiB)
TEXT_ONLY = ("document", "join_lines")  # what only plain text reads; text_field is JSONL's alone


@dataclass(frozen=True)
class ReadOptions:
    """How files become documents (see data/corpus.py's module docstring)."""

    format: str = option("auto", "auto: .jsonl/.ndjson/.json (.gz too) are JSONL, the rest plain text",
                         choices=FORMATS)
    text_field: str = option("text", "JSONL: the field holding the text")
    document: str = option("block", "plain text: a document per blank-line-separated block, or per file",
                           choices=DOCUMENTS)
    join_lines: bool = option(False, "plain text: lines of a block are wrapped prose, not sentences")
    errors: str = option("skip", "bytes that are not UTF-8: the piece of line skipped, replaced, or an error",
                         choices=ERRORS)
    max_document_chars: int = option(1 << 22, "characters of a document; a longer one is cut in parts",
                                     low=1, high=MAX_CHARS)
    max_sentence_chars: int = option(100_000, "characters of a sentence; a longer one is cut", low=1,
                                     high=MAX_CHARS)

    def __post_init__(self) -> None:
        check_options(self)
        if not self.text_field:
            raise OptionsError("text_field is empty: name the JSONL field holding the text", "text_field")
        # a setting of one format given where every file is the other is read by nothing: refused
        unread = (("text_field",) if self.format == "text" else TEXT_ONLY if self.format == "jsonl" else ())
        refuse_changed(self, unread, f"format={self.format} does not read it; drop it, or let format be auto")

    def format_of(self, path: Path) -> str:
        """'text' or 'jsonl' for a file (by its name without .gz unless set)."""
        if self.format != "auto":
            return self.format
        name = path.name.lower().removesuffix(".gz")
        return "jsonl" if name.endswith(JSONL_SUFFIXES) else "text"

    def to_dict(self) -> dict:
        """The options as plain data (recorded in shard manifests)."""
        return asdict(self)
