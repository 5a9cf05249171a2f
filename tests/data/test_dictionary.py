"""The GCIDE reader: entries in the dictionary's own layout (written here), and the real file when
installed."""
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


# GCIDE's markup that a first sense must not keep: a plural with a letter code, run-on entries and another
# part of speech's sense (their "n." / "adv." name the label), editors' notes, a variant's head line
MARKUP = """\
Abaculus \\Ab*ac"u*lus\\, n.; pl. Abaculi (-l[imac]). [L., dim. of abacus.]
   (Arch.) A small tile of glass or marble used in making patterns.
   [1913 Webster]

Agrarian \\A*gra"ri*an\\, a.
   Relating to lands held by the people of old Rome. -- n. One who favors an equal division.
   [1913 Webster]

Abruptly \\Ab*rupt"ly\\, adv.
   In an abrupt manner; without giving notice. -- Ab*rupt"ness, n.
   [1913 Webster]

Abasia \\A*ba"si*a\\, n.
   (Med.) Inability to coordinate muscular actions in walking. AS [archaic]
   [1913 Webster]

Caesura \\C[ae]*su"ra\\, n.
   A pause in a verse of the Latin poets. [Written also cesura.]
   [1913 Webster]

Adrenaline \\Ad*re"nal*ine\\, n.
   Also Adrenalin \\Ad*re"nal*in\\ (Physiol.) a hormone of the medulla.
   [1913 Webster]

Chordata \\Chor*da"ta\\, n. pl. [NL., fr. L. chorda cord.] (Zool.)
   A comprehensive division of animals including all Vertebrata.
   [1913 Webster]

Anaplerotic \\An`a*ple*rot"ic\\, a.
   n. (Med.) A substance which promotes the healing of wounds.
   [1913 Webster]

Abler \\A"bler\\, a.
   , comp. of Able. -- A"blest, a., superl. of Able.
   [1913 Webster]
"""


def test_first_senses_keep_no_markup_and_name_no_part_of_speech():
    """Respellings, run-on entries ("-- n.", "-- Ab*rupt"ness, n.": the label given away), letter codes,
    editors' notes and the rest of a head line were kept in the text the classification tasks train on."""
    assert definitions(MARKUP) == [
        ("Abaculus", "noun", "(Arch.) A small tile of glass or marble used in making patterns."),
        ("Agrarian", "adjective", "Relating to lands held by the people of old Rome."),
        ("Abruptly", "adverb", "In an abrupt manner; without giving notice."),
        ("Abasia", "noun", "(Med.) Inability to coordinate muscular actions in walking."),
        ("Caesura", "noun", "A pause in a verse of the Latin poets."),
        ("Adrenaline", "noun", "(Physiol.) a hormone of the medulla."),  # after its variant's head
        ("Chordata", "noun", "(Zool.) A comprehensive division of animals including all Vertebrata."),
    ]  # Anaplerotic, Abler: no definition of their own


def test_pos_task_splits_are_disjoint_balanced_and_seeded():
    text = "\n".join(f"Word{chr(97 + i // 26)}{chr(97 + i % 26)} \\W\\, {pos}.\n"
                     f"   A sense of four words {i}.\n"
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
    text = "\n".join(f"Word{chr(97 + i // 26)}{chr(97 + i % 26)} \\W\\, n.\n"
                     f"   {mark} A sense of four words {i}.\n"
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
