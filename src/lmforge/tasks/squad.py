"""SQuAD files and scores (Rajpurkar et al. 2016, 2018): reading a v1.1 / v2.0 JSON file into
question records, checked where a wrong value would be a silent wrong result, and the exact match and
F1 of the official evaluation scripts.

Scores: exact match and F1 as the official SQuAD evaluation script computes them
(normalise: lower-case, drop punctuation, drop a/an/the, collapse whitespace; the best
over the gold answers; an unanswerable question has the one gold answer ""), as fractions: by
the SQuAD 2.0 script where a record is unanswerable, else by SQuAD 1.1's (they differ only on
answers that normalise to nothing, such as "The").
"""
from __future__ import annotations

import collections
import json
import os
import re
import string
from pathlib import Path

from lmforge.config.options import OptionsError
from lmforge.tasks.tagging import decode_utf8
from lmforge.utils.errors import checked_text
from lmforge.utils.jsontext import loads

# ---- reading SQuAD JSON ----------------------------------------------------------------------


def _field(obj, key: str, kind: type, where: str):
    if not isinstance(obj, dict) or key not in obj:
        raise OptionsError(f"{where}: missing {key!r}")
    if not isinstance(obj[key], kind) or isinstance(obj[key], bool) is not (kind is bool):
        name = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise OptionsError(f"{where}.{key}: expected {name}, got {type(obj[key]).__name__}")
    return obj[key]


def _text(obj, key: str, where: str) -> str:
    """A question's or context's text, refused when blank (as a JSONL record's is): nothing to read; or
    when not valid Unicode (a lone surrogate, JSON's \\ud800, was refused later naming no file)."""
    text = _field(obj, key, str, where)
    if not text.strip():
        raise OptionsError(f"{where}.{key}: empty text")
    return checked_text(text, None, f"{where}.{key}")  # the file's fault: named by the message, as the others


def _impossible(qa: dict, where: str) -> bool:
    """A question's is_impossible: JSON true / false, or the integers 1 / 0 some converters write (absent:
    false); a string ("false" is truthy) or any other number is refused, not guessed."""
    flag = qa.get("is_impossible", False) if isinstance(qa, dict) else False
    if type(flag) is int and flag in (0, 1):
        return bool(flag)
    if not isinstance(flag, bool):
        raise OptionsError(f"{where}.is_impossible: expected true / false (or 1 / 0), got "
                           f"{json.dumps(flag, default=str)[:40]}")
    return flag


def _answers(qa: dict, context: str, where: str) -> list:
    """The answers of one question, each checked against the context at its start."""
    if _impossible(qa, where):
        # SQuAD 2.0 keeps "plausible_answers" for these, not gold; gold answers beside the flag contradict
        # it (the official script would score them, training would read the question as unanswerable)
        if qa.get("answers"):
            raise OptionsError(f"{where}: is_impossible is true but the question has {len(qa['answers'])} "
                               f"answer(s) (an unanswerable question's answers are [])")
        return []
    out = []
    for k, answer in enumerate(_field(qa, "answers", list, where)):
        at = f"{where}.answers[{k}]"
        text, start = _field(answer, "text", str, at), _field(answer, "answer_start", int, at)
        if not text.strip():  # "" matches at any start: the question would train as unanswerable
            raise OptionsError(f"{at}: the answer text is empty (an unanswerable question has answers [])")
        found = context[max(start, 0):start + len(text)]  # a negative start would index from the end
        if start < 0 or found != text:
            raise OptionsError(f"{at}: answer {text!r} is not at character {start} of the context "
                               f"(found {found!r})")
        out.append({"text": text, "start": start})
    return out


def read_squad(path: str | os.PathLike) -> list:
    """Questions of a SQuAD v1.1 / v2.0 JSON file -> [{"id", "question", "context", "answers",
    "line"}] (line = the question's 1-based position in the file; answers [] = unanswerable)."""
    path = Path(path)
    text = decode_utf8(path.read_bytes(), path)
    try:
        data = loads(text, unique_keys=True)
    except json.JSONDecodeError as err:
        raise OptionsError(f"{path}: line {err.lineno} column {err.colno}: not valid JSON "
                           f"({err.msg})") from None
    records, seen = [], {}
    for i, article in enumerate(_field(data, "data", list, str(path))):
        for j, paragraph in enumerate(_field(article, "paragraphs", list, f"{path}: data[{i}]")):
            where = f"{path}: data[{i}].paragraphs[{j}]"
            context = _text(paragraph, "context", where)
            for k, qa in enumerate(_field(paragraph, "qas", list, where)):
                at = f"{where}.qas[{k}]"
                key = str(_field(qa, "id", (str, int), at))
                if key in seen:  # the official script's predictions: a dict id -> answer, one would be lost
                    raise OptionsError(f"{at}.id: {key!r} is the id of an earlier question too "
                                       f"({seen[key]}); a SQuAD file's ids must be unique")
                seen[key] = at.removeprefix(f"{path}: ")
                records.append({"id": key, "question": _text(qa, "question", at), "context": context,
                                "answers": _answers(qa, context, at), "line": len(records) + 1})
    if not records:
        raise OptionsError(f"{path}: no questions")
    return records


# ---- SQuAD scores --------------------------------------------------------------------------------

PUNCTUATION = set(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """The official SQuAD normalisation: lower-case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(gold: str, predicted: str) -> float:
    """1.0 when the normalised answers are equal."""
    return float(normalize_answer(gold) == normalize_answer(predicted))


def token_f1(gold: str, predicted: str, empty_match: bool = True) -> float:
    """F1 of the normalised answers' word bags (an empty side: 1.0 only if both are empty, as SQuAD 2.0's
    script scores it; empty_match=False: 0.0, as SQuAD 1.1's script does)."""
    gold_words, predicted_words = normalize_answer(gold).split(), normalize_answer(predicted).split()
    if not gold_words or not predicted_words:
        return float(empty_match and gold_words == predicted_words)
    same = sum((collections.Counter(gold_words) & collections.Counter(predicted_words)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted_words), same / len(gold_words)
    return 2 * precision * recall / (precision + recall)


def gold_texts(answers: list) -> list:
    """The gold answer texts of a record (SQuAD 2.0's script: [""] when none survives normalisation)."""
    texts = [a["text"] for a in answers if normalize_answer(a["text"])]
    return texts or [""]


def squad_scores(records: list, predictions: list) -> dict:
    """f1 (primary) and exact_match over records, best over each record's gold answers (SQuAD 1.1's
    script; 2.0's where a record is unanswerable, adding has_answer_* and no_answer_* parts)."""
    if len(records) != len(predictions):
        raise ValueError(f"{len(records)} questions but {len(predictions)} predictions")
    if not records:
        raise ValueError("no questions to score")
    has = [bool(r["answers"]) for r in records]
    # Without unanswerable records the reference is SQuAD 1.1's script: every gold answer counts (2.0's
    # drops those that normalise to nothing, e.g. "The") and an empty side scores F1 0.
    v2 = not all(has)
    f1s, ems = [], []
    for record, predicted in zip(records, predictions):
        golds = gold_texts(record["answers"]) if v2 else [a["text"] for a in record["answers"]]
        f1s.append(max(token_f1(g, predicted, empty_match=v2) for g in golds))
        ems.append(max(exact_match(g, predicted) for g in golds))
    out = {"f1": sum(f1s) / len(f1s), "exact_match": sum(ems) / len(ems)}
    if v2:
        for name, keep in (("has_answer", True), ("no_answer", False)):
            part = [i for i, h in enumerate(has) if h == keep]
            if part:
                out[f"{name}_f1"] = sum(f1s[i] for i in part) / len(part)
                out[f"{name}_exact_match"] = sum(ems[i] for i in part) / len(part)
    return out
