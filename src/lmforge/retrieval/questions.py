"""Question / answer pairs for retrieval: built from the World the built-in corpus describes, or
read from a file a user brings.

A record is {"question": str, "answers": [str], "positives": [passage id]}: the passages that
state the fact asked about (retrieval is right when one of them is in the top k).

Built-in questions ask about facts stated in the built-in passages (a person's birth city, birth
year and job; a city's river and country), worded differently from the passage that states them
("What is X's job?" for "X works as a baker."), split train / dev / test by entity, seeded.

Files: a SQuAD v1.1 / v2.0 JSON file (.json: each context becomes a passage, its questions'
positive), or JSONL with "question", "answers" (list of strings) and either "positives" (passage
ids) or "context" (the passage text). A bad line is an error naming the file and line.
"""
from __future__ import annotations

import random
from pathlib import Path

from lmforge.data.world import World
from lmforge.retrieval.passages import Passage, record_text, utf8_lines
from lmforge.tasks.qa import read_squad
from lmforge.tasks.squad import normalize_answer
from lmforge.utils.jsontext import loads


def _person_facts(p) -> list:
    # (question, answer, evidence: a string the positive passage holds)
    return [(f"Where was {p.name} born?", p.city, f"{p.name} was born in {p.city}"),
            (f"In what year was {p.name} born?", str(p.year), f"in {p.city} in {p.year}"),
            (f"What is the job of {p.name}?", p.occupation,
             f"works as a{'n' if p.occupation[0] in 'aeiou' else ''} "
             f"{p.occupation}")]


def _city_facts(c) -> list:
    return [(f"Which river flows through {c.name}?", c.river, f"{c.name} lies on the {c.river} river"),
            (f"Which country is {c.name} part of?", c.country, f"It is a city in {c.country}")]


def builtin_questions(passages: list, seed: int = 0, world: World | None = None) -> dict:
    """{"train", "dev", "test"} question records about the built-in passages (see the module
    docstring); 80/10/10 by entity, so no test entity is asked about in training."""
    w = world or World(seed)
    by_title: dict = {}
    for p in passages:
        by_title.setdefault(p.title, []).append(p)
    entities = [(p.name, _person_facts(p)) for p in w.people] + [(c.name, _city_facts(c)) for c in w.cities]
    groups = []
    for title, facts in entities:
        group = []
        for question, answer, evidence in facts:
            positives = [p.id for p in by_title.get(title, []) if evidence in p.text]
            if positives:
                group.append({"question": question, "answers": [answer], "positives": positives})
        groups.append(group)
    random.Random(seed).shuffle(groups)
    n = len(groups)
    cut = [int(0.8 * n), int(0.9 * n)]
    parts = (groups[:cut[0]], groups[cut[0]:cut[1]], groups[cut[1]:])
    return {name: [r for g in part for r in g] for name, part in zip(("train", "dev", "test"), parts)}


def _strings(value, where: str, key: str) -> list:
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                              for v in value):
        raise ValueError(f"{where}: field {key!r} must be a list of strings")
    return [record_text(v, where, f"{key}[{i}]", blank=True) if isinstance(v, str) else str(v)
            for i, v in enumerate(value)]


def _jsonl_record(line: str, where: str, contexts: dict) -> dict:
    try:
        record = loads(line)
    except ValueError as err:
        raise ValueError(f"{where}: not JSON ({err.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get("question"), str):
        raise ValueError(f"{where}: field 'question' missing or not a string")
    record_text(record["question"], where, "question")
    answers = _strings(record.get("answers", []), where, "answers")
    if "positives" in record:
        positives = _strings(record["positives"], where, "positives")
    elif isinstance(record.get("context"), str):
        context = record_text(record["context"], where, "context")
        positives = [contexts.setdefault(context, str(len(contexts)))]
    else:
        raise ValueError(f"{where}: needs 'positives' (passage ids) or 'context' (the passage text)")
    return {"question": record["question"], "answers": answers, "positives": positives}


def read_questions(path) -> tuple:
    """(question records, passages made from the file's contexts) of a SQuAD JSON or QA JSONL file."""
    path = Path(path)
    contexts: dict = {}  # context text -> passage id
    if path.suffix == ".json":
        records = [{"question": r["question"], "answers": [a["text"] for a in r["answers"]],
                    "positives": [contexts.setdefault(r["context"], str(len(contexts)))]}
                   for r in read_squad(path)]
    else:
        records = [_jsonl_record(line, f"{path}: line {n}", contexts) for n, line in utf8_lines(path)
                   if line.strip()]
        if not records:
            raise ValueError(f"{path}: no questions")
    passages = [Passage(i, f"{path.stem} {i}", text) for text, i in contexts.items()]
    return records, passages


def check_answers(records: list, source) -> None:
    """Every question has an answer, none of them empty once normalised (a reader or RAG is trained on them
    and scored by exact match against them: "" or "..." would match an empty prediction); ValueError naming
    the source and question otherwise (a SQuAD 2.0 file's unanswerable ones). An answer of articles alone
    ("A", "the") stays: a word, which SQuAD's own scoring normalises away too."""
    for n, r in enumerate(records, 1):
        if not r["answers"]:
            raise ValueError(f"{source}: question {n} has no answer: a reader or RAG is trained and scored "
                             "on answered questions (drop the unanswerable ones)")
        empty = next((a for a in r["answers"] if not normalize_answer(a) and not any(c.isalnum() for c in a)),
                     None)
        if empty is not None:
            raise ValueError(f"{source}: question {n}: answer {empty!r} is empty once normalised: exact "
                             "match (SQuAD's, without punctuation) would count an empty prediction as it")


def check_positives(records: list, passages: list, source) -> None:
    """Every positive id names a passage; ValueError naming the source and question otherwise."""
    ids = {p.id for p in passages}
    for n, r in enumerate(records, 1):
        missing = [i for i in r["positives"] if i not in ids]
        if missing:
            raise ValueError(f"{source}: question {n}: positive passage id {missing[0]!r} is not in the "
                             "passages")
