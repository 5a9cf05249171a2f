"""A built-in synthetic treebank: English-like sentences from a small grammar, each with its gold
dependency tree (Universal Dependencies relations), UPOS tags and long-range links; same seed,
same sentences.

The grammar: determiners, adjectives and nouns (or names), with prepositional phrases and subject
or object relative clauses after a noun; intransitive and transitive verbs that agree in number
with their subject (present tense; the past tense shows no agreement); fronted prepositional
phrases, adverbs, coordinated subjects, and a second clause (", and" / ", but") whose pronoun
subject refers back to the first clause's subject. Some words are ambiguous out of context (watch,
walks, plays, visit: noun or verb; "that": determiner or relative pronoun), so a part of speech
sometimes needs the words around it. Every tree is projective.

A sentence is a record {"words", "upos", "heads", "deprels", "links", "line"}: heads[i] is the
0-based index of word i's head, -1 for the root (CoNLL-U counts from 1; lmforge.data.conllu
converts). A link is [kind, i, j, label] over 0-based word indices, one pair to classify:

- ["agreement", noun, verb, "subject" | "attractor"]: for a verb whose subject is separated from
  it by other nouns (the attractors of Linzen et al. 2016), the subject and each attractor;
- ["coref", noun, pronoun, "antecedent" | "other"]: the second clause's pronoun and each noun of
  the first clause; the antecedent is the first clause's subject, and other nouns often share its
  gender and number, so the pronoun's form alone does not decide.
"""
from __future__ import annotations

import random
from dataclasses import dataclass


def _plural(noun: str) -> str:
    """English plural of a regular noun (box -> boxes, lady -> ladies, dog -> dogs)."""
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _nouns(text: str, gender: str) -> list:
    """(singular, plural, gender) of "word" or "word:irregular-plural" entries."""
    return [(w.split(":")[0], w.split(":")[1] if ":" in w else _plural(w), gender) for w in text.split()]


def _verbs(text: str) -> list:
    """(present singular, present plural, past) of "base:past" entries (the singular is the base's
    third person: watch -> watches, carry -> carries, sing -> sings)."""
    return [(_plural(v.split(":")[0]), *v.split(":")) for v in text.split()]


DETERMINERS = {"sg": ["the", "a", "every", "this", "that"], "pl": ["the", "some", "these", "those", "many"]}
ADJECTIVES = ["old", "small", "happy", "red", "quiet", "tall", "young", "green", "busy", "lazy", "big",
              "little", "angry", "brave", "calm", "clever", "dark", "eager", "famous", "gentle", "huge",
              "kind", "loud", "new", "nice", "poor", "proud", "rich", "sad", "shy", "silly", "strange",
              "strong", "sweet", "tiny", "ugly", "warm", "wild", "wise", "blue", "brown", "black", "white",
              "yellow", "cold", "bright", "heavy", "empty", "clean", "dirty"]
# (singular, plural, gender): the gender picks the pronoun that refers back (he, she, it; they);
# watch, walk, play, visit, dance, call are verbs too, so their part of speech needs their context
NOUNS = (_nouns("man:men boy king father brother son uncle prince husband monk nephew waiter actor duke "
                "gentleman:gentlemen grandfather", "m")
         + _nouns("woman:women girl queen mother sister daughter aunt princess wife:wives lady nun niece "
                  "waitress actress duchess grandmother", "f")
         + _nouns("dog cat box house watch walk play visit dance call horse bird car tree table chair "
                  "book lamp door window river bridge garden boat train bus clock bottle cup apple flower "
                  "stone hill road shop school church tower wall field farm ship plane letter picture bag "
                  "key coin ring shoe hat coat bell drum map kite rock lake cake egg fox wolf:wolves "
                  "mouse:mice goose:geese rabbit lion tiger bear duck frog snake", "n"))
NAMES = [(n, "m") for n in ("John", "Peter", "David", "Tom", "James", "Paul")] + \
        [(n, "f") for n in ("Mary", "Anna", "Emma", "Sarah", "Lucy", "Kate")]
# syllables of made-up names: a long tail of rare words, as real text has (a control task's labels
# can then not all be memorised from the training split)
SYLLABLES = ["ka", "lo", "mi", "ren", "dor", "sa", "vel", "tin", "bar", "ni", "os", "ul", "fen", "ga",
             "rho", "zi", "mor", "tal", "bek", "quin"]
INTRANSITIVE = _verbs("sleep:slept run:ran smile:smiled walk:walked wait:waited play:played "
                      "laugh:laughed arrive:arrived cry:cried sing:sang dance:danced jump:jumped swim:swam "
                      "fall:fell sit:sat stand:stood talk:talked listen:listened work:worked rest:rested "
                      "shout:shouted return:returned leave:left call:called")
TRANSITIVE = _verbs("see:saw like:liked watch:watched follow:followed find:found help:helped "
                    "visit:visited carry:carried love:loved hate:hated meet:met know:knew push:pushed "
                    "pull:pulled hold:held paint:painted chase:chased catch:caught bring:brought buy:bought "
                    "sell:sold hide:hid admire:admired remember:remembered")
PREPOSITIONS = ["near", "behind", "with", "under", "beside", "above", "below", "inside", "outside",
                "across", "along", "around", "beyond", "toward"]
ADVERBS = ["often", "quickly", "again", "slowly", "never", "always", "rarely", "quietly", "suddenly",
           "sometimes"]
PRONOUNS = {"m": "he", "f": "she", "n": "it", "pl": "they"}
CONJUNCTIONS = ["and", "but"]
LINK_KINDS = ("agreement", "coref")


@dataclass
class _Phrase:
    """A noun phrase as the grammar sees it: its head word, number and gender."""

    head: int
    number: str
    gender: str
    coordinated: bool = False


class _Sentence:
    """Words added left to right; each attached to its head once the head exists."""

    def __init__(self) -> None:
        self.words, self.upos, self.heads, self.deprels, self.links = [], [], [], [], []

    def add(self, word: str, upos: str) -> int:
        self.words.append(word)
        self.upos.append(upos)
        self.heads.append(None)
        self.deprels.append(None)
        return len(self.words) - 1

    def attach(self, dependent: int, head: int, deprel: str) -> None:
        self.heads[dependent], self.deprels[dependent] = head, deprel

    def record(self, line: int) -> dict:
        if None in self.heads:  # a grammar rule that forgot an attachment: a bug here, never data
            raise AssertionError(f"unattached word {self.words[self.heads.index(None)]!r} in {self.words}")
        return {"words": self.words, "upos": self.upos, "heads": self.heads, "deprels": self.deprels,
                "links": self.links, "line": line}


def _noun_phrase(s: _Sentence, rng: random.Random, number: str | None = None, gender: str | None = None,
                 names: bool = True) -> _Phrase:
    """DET ADJ* NOUN, or a name; of the given number and gender where given."""
    number = number or rng.choice(("sg", "pl"))
    if names and number == "sg" and gender != "n" and rng.random() < 0.2:
        name, g = rng.choice([n for n in NAMES if gender in (None, n[1])])
        if rng.random() < 0.5:  # a made-up name of the same gender: "Kalomi"
            name = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
        return _Phrase(s.add(name, "PROPN"), "sg", g)
    det = s.add(rng.choice(DETERMINERS[number]), "DET")
    adjectives = [s.add(rng.choice(ADJECTIVES), "ADJ") for _ in range(rng.choice((0, 0, 1, 1, 2)))]
    singular, plural, g = rng.choice([n for n in NOUNS if gender in (None, n[2])])
    noun = s.add(singular if number == "sg" else plural, "NOUN")
    if s.words[det] == "a" and s.words[det + 1][0] in "aeiou":
        s.words[det] = "an"
    s.attach(det, noun, "det")
    for a in adjectives:
        s.attach(a, noun, "amod")
    return _Phrase(noun, number, g)


def _verb(s: _Sentence, rng: random.Random, number: str, tense: str, transitive: bool) -> int:
    """A verb agreeing with a subject of `number` (present tense) or in the past tense."""
    sg, pl, past = rng.choice(TRANSITIVE if transitive else INTRANSITIVE)
    return s.add(past if tense == "past" else (sg if number == "sg" else pl), "VERB")


def _modifier(s: _Sentence, rng: random.Random, noun: _Phrase, tense: str) -> list:
    """A prepositional phrase or a relative clause after `noun`; returns the nouns it adds."""
    r = rng.random()
    if r < 0.5:  # PP: "near the boxes" (the inner noun is an nmod of the outer one)
        case = s.add(rng.choice(PREPOSITIONS), "ADP")
        inner = _noun_phrase(s, rng)
        s.attach(case, inner.head, "case")
        s.attach(inner.head, noun.head, "nmod")
        return [inner.head]
    that = s.add("that", "PRON")
    if r < 0.75:  # subject relative: "that sees the cats" (the verb agrees with the outer noun)
        verb = _verb(s, rng, noun.number, tense, transitive=True)
        inner = _noun_phrase(s, rng)
        s.attach(that, verb, "nsubj")
        s.attach(inner.head, verb, "obj")
    else:  # object relative: "that the cats see" (the verb agrees with the inner noun)
        inner = _noun_phrase(s, rng)
        verb = _verb(s, rng, inner.number, tense, transitive=True)
        s.attach(that, verb, "obj")
        s.attach(inner.head, verb, "nsubj")
    s.attach(verb, noun.head, "acl:relcl")
    return [inner.head]


def _subject(s: _Sentence, rng: random.Random) -> _Phrase:
    """A noun phrase, sometimes two coordinated ones ("the dog and the cat": plural)."""
    first = _noun_phrase(s, rng)
    if rng.random() >= 0.1:
        return first
    cc = s.add("and", "CCONJ")
    second = _noun_phrase(s, rng)
    s.attach(cc, second.head, "cc")
    s.attach(second.head, first.head, "conj")
    return _Phrase(first.head, "pl", "pl", coordinated=True)


def _clause(s: _Sentence, rng: random.Random, tense: str, subject: _Phrase | None = None) -> tuple:
    """[PP ,] subject [modifier] [ADV] verb [object | PP]; returns (verb, subject, nouns added)."""
    fronted, pronoun = None, subject is not None  # a pronoun subject takes no modifier
    if not pronoun and rng.random() < 0.2:  # "behind the house , the dog sleeps"
        case = s.add(rng.choice(PREPOSITIONS), "ADP")
        fronted = _noun_phrase(s, rng)
        s.attach(case, fronted.head, "case")
        comma = s.add(",", "PUNCT")
    subject = subject or _subject(s, rng)
    modified = not (pronoun or subject.coordinated) and rng.random() < 0.6
    attractors = _modifier(s, rng, subject, tense) if modified else []
    adverb = s.add(rng.choice(ADVERBS), "ADV") if rng.random() < 0.15 else None
    transitive = rng.random() < 0.55
    verb = _verb(s, rng, subject.number, tense, transitive)
    s.attach(subject.head, verb, "nsubj")
    if adverb is not None:
        s.attach(adverb, verb, "advmod")
    if fronted is not None:
        s.attach(fronted.head, verb, "obl")
        s.attach(comma, verb, "punct")
    nouns = ([fronted.head] if fronted else []) + [subject.head] + attractors
    if transitive:  # the object often shares the subject's gender and number: a pronoun's hard case
        like = rng.random() < 0.5 and not subject.coordinated
        obj = _noun_phrase(s, rng, subject.number if like else None, subject.gender if like else None)
        s.attach(obj.head, verb, "obj")
        nouns.append(obj.head)
    elif rng.random() < 0.4:  # "sleeps under the house"
        case = s.add(rng.choice(PREPOSITIONS), "ADP")
        place = _noun_phrase(s, rng)
        s.attach(case, place.head, "case")
        s.attach(place.head, verb, "obl")
        nouns.append(place.head)
    if attractors:
        s.links.append(["agreement", subject.head, verb, "subject"])
        s.links.extend(["agreement", a, verb, "attractor"] for a in attractors)
    return verb, subject, nouns


def sentence(rng: random.Random, line: int = 0) -> dict:
    """One sentence of the grammar with its tree, tags and links (see the module docstring)."""
    s = _Sentence()
    tense = "present" if rng.random() < 0.7 else "past"
    verb, subject, nouns = _clause(s, rng, tense)
    if rng.random() < 0.5:  # ", and he smiles": the pronoun refers back to the first subject
        comma = s.add(",", "PUNCT")
        cc = s.add(rng.choice(CONJUNCTIONS), "CCONJ")
        pronoun = None
        if not subject.coordinated:
            key = "pl" if subject.number == "pl" else subject.gender
            pronoun = _Phrase(s.add(PRONOUNS[key], "PRON"), subject.number, subject.gender)
        second, _, _ = _clause(s, rng, tense, pronoun)
        s.attach(comma, second, "punct")
        s.attach(cc, second, "cc")
        s.attach(second, verb, "conj")
        if pronoun is not None:
            s.links.extend(["coref", n, pronoun.head, "antecedent" if n == subject.head else "other"]
                           for n in nouns)
    s.attach(s.add(".", "PUNCT"), verb, "punct")
    s.attach(verb, -1, "root")
    return s.record(line)


def treebank(n: int, seed: int = 0) -> list:
    """`n` sentences of the grammar, the same for the same seed."""
    if n < 1:
        raise ValueError(f"a treebank needs at least one sentence, got n={n}")
    rng = random.Random(seed)
    return [sentence(rng, i + 1) for i in range(n)]


def treebank_splits(n: int, seed: int = 0, held_out: float = 0.1) -> dict:
    """{"train", "dev", "test"} of `n` sentences: dev and test each `held_out` of them (at least one)."""
    if not 0 < held_out < 0.5:
        raise ValueError(f"held_out={held_out} must be between 0 and 0.5 (dev and test each get that share)")
    records = treebank(max(n, 3), seed)
    n_dev = max(1, int(len(records) * held_out))
    return {"train": records[: len(records) - 2 * n_dev], "dev": records[-2 * n_dev: -n_dev],
            "test": records[-n_dev:]}


def held_out_splits(records: list, seed: int, held_out: float) -> dict:
    """{"train", "dev", "test"} of a treebank's `records`, shuffled by `seed`: dev and test each about
    `held_out` of them (at least one sentence). A sentence written more than once (the same words) goes
    whole to one split: a copy in train would let a probe score a test sentence it was fitted on."""
    groups: dict = {}
    for record in records:
        groups.setdefault(tuple(record["words"]), []).append(record)
    if len(groups) < 3:
        raise ValueError(f"{len(groups)} distinct sentence(s); train, dev and test need at least 3")
    order = list(groups.values())
    random.Random(seed).shuffle(order)
    # test, then dev, taken from the end of the order: a file without repeats splits as it always has
    # (train the first records, dev the n before the last n), whatever the seed
    n, sizes, names = max(1, int(len(records) * held_out)), {"test": 0, "dev": 0}, []
    for left, group in zip(range(len(order), 0, -1), reversed(order)):  # train keeps at least one group
        name = next((s for s in sizes if sizes[s] < n and left > (s == "test") + 1), "train")
        sizes[name] = sizes.get(name, 0) + len(group)
        names.append(name)
    splits = {"train": [], "dev": [], "test": []}
    for name, group in zip(reversed(names), order):
        splits[name] += group
    return splits


def tree_error(heads: list) -> str | None:
    """Why 0-based `heads` (-1: root) is not a tree (no root, two roots, a cycle, a head out of
    range), or None for a tree."""
    n = len(heads)
    roots = [i for i, h in enumerate(heads) if h == -1]
    if len(roots) != 1:
        return f"{len(roots)} roots (words {[i + 1 for i in roots]}); a tree has one" if roots else "no root"
    for i, h in enumerate(heads):
        if h != -1 and not 0 <= h < n:
            return f"word {i + 1} has head {h + 1}, outside the sentence's {n} words"
        if h == i:
            return f"word {i + 1} is its own head"
    for i in range(n):  # walking up from any word must reach the root within n steps
        seen, at = 0, i
        while at != -1 and seen <= n:
            at, seen = heads[at], seen + 1
        if at != -1:
            return f"a cycle through word {i + 1}"
    return None


def is_projective(heads: list) -> bool:
    """True when no two arcs cross (a tree drawn above the words without crossings); the root's arc
    comes from before the first word, so no arc may span the root either."""
    arcs = [(min(i, h), max(i, h)) for i, h in enumerate(heads)]
    return not any(a < c < b < d for a, b in arcs for c, d in arcs)
