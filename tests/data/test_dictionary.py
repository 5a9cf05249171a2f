"""The GCIDE reader: entries in the dictionary's own layout (written here), and the real file when installed."""
import gzip

import pytest

from lmforge.data.dictionary import FIELDS, definitions, field_task, pos_task, read_gcide
from tests import requires

# four entries in GCIDE's layout (head line, inflections, etymology, numbered senses, source marks)
EXCERPT = """\
Abandon \\A*ban"don\\ ([.a]*b[a^]n"d[u^]n), v. t. [imp. & p. p.
   {Abandoned} (-d[u^]nd); p. pr. & vb. n. {Abandoning}.] [OF.
   abandoner, F. abandonner.]
   1. To cast or drive out; to banish; to expel; to reject.
      [Obs.] --Shak.
      [1913 Webster]

Abaft \\A*baft"\\, adv. (Naut.)
   Toward the stern; aft; as, to go abaft.
   [1913 Webster]

Abjectly \\Ab"ject*ly\\ ([a^]b"j[e^]kt*l[y^]), adv.
   Meanly; servilely.
   [1913 Webster]

Abjectness \\Ab"ject*ness\\ ([a^]b"j[e^]kt*n[e^]s), n.
   The state of being {abject}; abasement; meanness; servility.
   --Grew.
   [1913 Webster]

Abacus \\Ab"a*cus\\, n.
   A calculating frame of an abacus kind.
   [1913 Webster]
"""


def test_first_senses_drop_inflections_etymology_and_source_marks():
    assert definitions(EXCERPT) == [
        ("Abandon", "verb", "To cast or drive out; to banish; to expel; to reject."),
        ("Abjectness", "noun", "The state of being abject; abasement; meanness; servility."),
    ]  # Abjectly: fewer than four words; Abaft and Abacus: the definition names the headword


def test_pos_task_splits_are_disjoint_balanced_and_seeded():
    text = "\n".join(f"Word{chr(97 + i // 26)}{chr(97 + i % 26)} \\W\\, {pos}.\n   A sense of four words {i}.\n"
                     "   [1913 Webster]\n" for i, pos in enumerate(["n", "adv", "v. t", "a"] * 10))
    task = pos_task(n_per_label=5, seed=3, text=text)
    texts = [r["text"] for split in task.values() for r in split]
    assert len(texts) == len(set(texts)) == 20
    labels = [r["label"] for split in task.values() for r in split]
    assert {label: labels.count(label) for label in set(labels)} == {"noun": 5, "adverb": 5, "verb": 5,
                                                                     "adjective": 5}
    assert pos_task(n_per_label=5, seed=3, text=text) == task and pos_task(5, seed=4, text=text) != task
    more = pos_task(n_per_label=5, seed=3, text=text, held_out_per_label=3)
    assert {k: more[k] for k in task} == task  # the other splits stay as they were
    held = [r["text"] for r in more["held_out"]]
    assert len(held) == 12 and not set(held) & set(texts)
    assert sorted(r["label"] for r in more["held_out"]) == sorted(["noun", "adverb", "verb", "adjective"] * 3)


def test_field_task_labels_a_definition_by_its_field_mark_and_removes_the_mark():
    marks = ["(Bot.)", "(Zool.)", "(Law)", ""] * 6  # Law: not among the fields asked for; "": no mark
    text = "\n".join(f"Word{chr(97 + i // 26)}{chr(97 + i % 26)} \\W\\, n.\n   {mark} A sense of four words {i}.\n"
                     "   [1913 Webster]\n" for i, mark in enumerate(marks))
    task = field_task(n_per_label=4, seed=1, text=text, fields=("Bot.", "Zool."))
    records = [r for split in task.values() for r in split]
    assert sorted(r["label"] for r in records) == ["Bot."] * 4 + ["Zool."] * 4
    assert all(r["text"].startswith("A sense of four words") for r in records)  # the mark is not the answer
    assert field_task(n_per_label=4, seed=1, text=text, fields=("Bot.", "Zool.")) == task


def test_a_missing_file_names_the_debian_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="install the Debian package dict-gcide"):
        read_gcide(tmp_path / "gcide.dict.dz")


def test_the_dictzip_file_reads_as_gzip(tmp_path):
    path = tmp_path / "gcide.dict.dz"
    path.write_bytes(gzip.compress(EXCERPT.encode()))
    assert read_gcide(path) == EXCERPT


# slow (the whole 13 MB dictionary, read twice): the layout is read by the tests above on entries written
# in it, and the tasks' splits on those; CI's `make test-slow` reads the real file
@pytest.mark.slow
@requires.dictionary("gcide")
def test_the_installed_dictionary_gives_tens_of_thousands_of_definitions():
    found = definitions()
    assert len(found) > 50_000
    assert {pos for _, pos, _ in found} == {"noun", "verb", "adjective", "adverb"}
    assert ("Abandon", "verb", "To cast or drive out; to banish; to expel; to reject.") in found
    fields = field_task(n_per_label=300)
    labels = [r["label"] for split in fields.values() for r in split]
    assert {label: labels.count(label) for label in set(labels)} == {f: 300 for f in FIELDS}
