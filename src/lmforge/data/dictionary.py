"""Real English text no one here wrote: the Collaborative International Dictionary of English.

Debian's `dict-gcide` package installs it as /usr/share/dictd/gcide.dict.dz (dictzip, which gzip
reads). This module installs nothing: a missing file is an error naming the package.

`definitions()` reads (headword, part of speech, first definition) triples; `pos_task()` turns
them into a real classification task: a headword's part of speech from its definition alone;
`field_task()` into a harder one: the field of knowledge a definition is marked with (Zool., Bot., ...).
"""
from __future__ import annotations

import gzip
import random
import re
from pathlib import Path

GCIDE = Path("/usr/share/dictd/gcide.dict.dz")
# GCIDE's abbreviations -> the task's labels (transitive and intransitive verbs are both verbs)
POS = {"n": "noun", "v. t": "verb", "v. i": "verb", "a": "adjective", "adv": "adverb"}
# an entry's head line: Word \pronunciation\ (respelling), n. | v. t. | v. i. | a. | adv.
_HEAD = re.compile(r"^([A-Za-z][a-z-]+) \\[^\\\n]+\\(?: \([^)\n]*\))?,\s+(n|v\. t|v\. i|a|adv)\.", re.M)
_SOURCE = re.compile(r"\[(?:1913 Webster|PJC|WordNet[^\]]*|Webster 1913 Suppl\.|Obs\.|R\.)\]|\{|\}|--\S.*")
_FIELD = re.compile(r"^\(([A-Z][a-z]+\.?)\)")  # a definition's field mark: "(Bot.)", "(Law)"
FIELDS = ("Zool.", "Bot.", "Chem.", "Med.", "Anat.", "Min.", "Biol.", "Naut.")  # GCIDE's eight most used
# "; pl. Canthi." or "; pl. Abaculi (-l[imac])." between the head and the etymology
_PLURAL = re.compile(r"^\s*;\s*pl\.\s*(?:[^.\[]|\[[^\]\n]*\])*\.")
# where a first sense ends: a run-on entry or word in GCIDE's respelling ("-- Pol`li*na"tion, n.",
# "Ab`i*o*ge*net"ic*al*ly, adv.") or another part of speech's sense ("-- n. A native": either would give
# the label away), an editor's note ("[Written also ...]", "[1913 Webster + AS]", "[archaic]"), a variant's
# head ("Also Adrenalin \Ad*re"nal*in\")
_TAIL = re.compile(r"(?:\s--)?\s*\S*[A-Za-z][*`\"][A-Za-z]|\s--\s+(?:n|a|adv|v\. [ti])\.|\\"
                   r"|\s\[(?=[A-Z0-9][^\]]*[\s.]|[A-Z][a-z]+\]|AS\]|archaic\])")
# before the first sense: a variant's head ("Also Jahvism \Jah"vism\", ", older Jehovist \Je*ho"vist\"),
# or a plural noun's "pl." before its etymology ("Chordata ..., n. pl. [NL., fr. L. chorda cord.] (Zool.)")
_LEADING = re.compile(r"^\s*(?:Also\s+(?:(?:older\s+|or\s+)?[A-Za-z][\w-]*\s*\\[^\\\n]*\\,?\s*)+"
                      r"|pl\.\s*(?=\[))")
# a definition starts with a word or a field mark, not a part of speech ("n. (Med.) A substance")
_DEFINITION = re.compile(r"(?!(?:n|a|adv|v\. [ti])\.\s)[\w(]")
_CHARS = re.compile(r"\[(ae|oe|AE|OE|alpha|beta|gamma|delta|mu|pi)\]"  # a letter's code: the letter
                    r"|\[[-=.^~\"`]?([A-Za-z])(?:[=^~\"`]|mac|acute|grave|cedil)?\]")


def read_gcide(path: Path = GCIDE) -> str:
    """The dictionary's text; a missing file names the Debian package that installs it."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} not found: install the Debian package dict-gcide "
                                "(apt-get install dict-gcide)")
    return gzip.open(path).read().decode("utf-8", "replace")


def _after_brackets(text: str) -> str:
    """text without its leading bracketed groups ([imp. & p. p. ...] [OF. ...]), nested ones
    ([=a] inside a respelling) included."""
    text = text.lstrip()
    while text.startswith("["):
        depth = 0
        for i, char in enumerate(text):
            depth += {"[": 1, "]": -1}.get(char, 0)
            if depth == 0:
                break
        text = text[i + 1:].lstrip()
    return text


def _first_sense(body: str) -> str:
    """The first definition of an entry's body: after the inflections and etymology, up to the
    first source mark."""
    body = _LEADING.sub("", _PLURAL.sub("", body[body.find(".") + 1:], count=1), count=1)
    body = _after_brackets(body)
    sense = body.split("[1913 Webster]")[0].split("[PJC]")[0].split("\n\n")[0]
    sense = re.sub(r"^\s*(?:\d+\.|\(\w\))\s*", "", sense.strip())
    sense = re.sub(r"^(?:\[[^\]]*\]\s*)+", "", sense)  # [Obs.] [Colloq.] usage labels first
    tail = _TAIL.search(sense)
    sense = _CHARS.sub(lambda m: m.group(1) or m.group(2), sense[:tail.start()] if tail else sense)
    return re.sub(r"\s+AS$", "", " ".join(_SOURCE.sub("", sense).split())).rstrip(" ;,-")  # AS: a source mark


def definitions(text: str | None = None) -> list:
    """(headword, part of speech, first definition) of every entry with a part of speech the
    task knows and a definition of at least four words that does not name the headword."""
    text = read_gcide() if text is None else text
    heads = list(_HEAD.finditer(text))
    out = []
    for match, following in zip(heads, heads[1:] + [None]):
        end = following.start() if following is not None else len(text)
        sense = _first_sense(text[match.end() - 1:end])
        word = match.group(1)
        # one that starts with a mark is the rest of a head line (", comp. of Able."), no definition
        if len(sense.split()) >= 4 and _DEFINITION.match(sense) and word.lower() not in sense.lower():
            out.append((word, POS[match.group(2)], sense))
    return out


def pos_task(n_per_label: int = 500, seed: int = 0, text: str | None = None,
             held_out_per_label: int = 0) -> dict:
    """Train / validation / test splits (80/10/10) of {"text": definition, "label": part of
    speech}, n_per_label records of each part of speech, one record per headword, seeded; with
    held_out_per_label, a "held_out" split of that many more per label (headwords in no other
    split), for scores that one example cannot tip. The other splits do not change with it."""
    by_label: dict = {}
    seen = set()
    for word, label, sense in definitions(text):
        if word.lower() not in seen:
            seen.add(word.lower())
            by_label.setdefault(label, []).append({"text": sense, "label": label})
    return _splits(by_label, n_per_label, seed, held_out_per_label)


def field_task(n_per_label: int = 400, seed: int = 0, text: str | None = None,
               fields: tuple = FIELDS) -> dict:
    """pos_task's splits for a harder question: the field of knowledge a first definition is marked with
    ("(Zool.) A genus of ..."), the mark removed, among `fields` (the eight most used): zoology, botany,
    anatomy, physiology and medicine share much of their vocabulary."""
    by_label: dict = {}
    seen = set()
    for word, _, sense in definitions(text):
        mark = _FIELD.match(sense)
        if mark and mark.group(1) in fields and word.lower() not in seen:
            rest = sense[mark.end():].strip()
            if len(rest.split()) >= 4:
                seen.add(word.lower())
                by_label.setdefault(mark.group(1), []).append({"text": rest, "label": mark.group(1)})
    return _splits(by_label, n_per_label, seed)


def _splits(by_label: dict, n_per_label: int, seed: int, held_out_per_label: int = 0) -> dict:
    rng = random.Random(seed)
    records, extra = [], []
    for label in sorted(by_label):
        pool = by_label[label]
        rng.shuffle(pool)
        records += pool[:n_per_label]
        extra += pool[n_per_label:n_per_label + held_out_per_label]
    rng.shuffle(records)
    n = len(records)
    splits = {"train": records[:int(0.8 * n)], "validation": records[int(0.8 * n):int(0.9 * n)],
              "test": records[int(0.9 * n):]}
    if held_out_per_label:
        random.Random(seed + 1).shuffle(extra)
        splits["held_out"] = extra
    return splits
