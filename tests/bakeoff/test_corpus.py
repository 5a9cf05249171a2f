"""The dictd corpus loader: entries as prose without their labels, missing packages named."""
from __future__ import annotations

import gzip

import pytest

from lmforge.bakeoff.corpus import SOURCES, clean, dictd_path, documents, entries, topic_task
from tests import requires

FOLDOC = """00-database-short
     The Free On-line Dictionary of Computing

ALGOL

   <language> {ALGOrithmic Language}.  An early, {block
   structured} language designed by an international committee.

   (1996-11-28)

Ethernet

   <networking> A {local area network} first described by
   Metcalfe & Boggs of Xerox PARC in 1976.  [{Jargon File}]

   (2003-06-18)
"""


def write(tmp_path, name, text):
    path = tmp_path / SOURCES[name][0]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


def test_entries_drop_the_database_header_and_clean_drops_markup(tmp_path):
    found = entries(write(tmp_path, "foldoc", FOLDOC))
    assert [head for head, _ in found] == ["ALGOL", "Ethernet"]
    text = clean(found[0][1])
    assert text == "ALGOrithmic Language. An early, block structured language designed by an international " \
        "committee."
    assert "<" not in clean(found[1][1]) and "Jargon File" not in clean(found[1][1])


def test_documents_are_a_seeded_sample(tmp_path):
    write(tmp_path, "foldoc", FOLDOC)
    assert len(documents("foldoc", 5, root=tmp_path)) == 2
    assert documents("foldoc", 1, seed=3, root=tmp_path) == documents("foldoc", 1, seed=3, root=tmp_path)


def test_a_missing_dictionary_names_its_debian_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="dict-jargon"):
        dictd_path("jargon", tmp_path)


@requires.dictionary("foldoc")
def test_installed_foldoc_gives_a_balanced_topic_task():
    splits = topic_task(n_per_label=20, seed=1)
    train = splits["train"]
    assert len(train) + len(splits["validation"]) + len(splits["test"]) == 80
    assert len({r["label"] for r in train}) == 4
    assert all(f"<{r['label']}>" not in r["text"] for r in train)  # the label is not in the text
    assert topic_task(n_per_label=20, seed=1) == splits
