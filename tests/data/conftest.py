"""Shared fixtures of the data tests: a small corpus in several formats and a tokenizer for it."""
import gzip
import json

import pytest

from lmforge.data.synthetic import corpus_text, documents, write_corpus
from lmforge.tokenizer import train_tokenizer
from tests.tasks.core import no_loss_plot  # noqa: F401  (an autouse fixture: no loss.png drawn)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """a.txt (~60 kB), b.jsonl.gz (200 records) and c.txt (~30 kB) of the built-in corpus."""
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root / "a.txt", 60_000, seed=1)
    with gzip.open(root / "b.jsonl.gz", "wt", encoding="utf-8") as handle:
        for doc in documents(200, seed=2):
            handle.write(json.dumps({"text": " ".join(doc)}) + "\n")
    write_corpus(root / "c.txt", 30_000, seed=3)
    return root


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A WordPiece tokenizer (BERT specials) trained on the built-in corpus, saved."""
    path = tmp_path_factory.mktemp("tok")
    train_tokenizer(corpus_text(500, seed=0).splitlines(), "wordpiece", 400).save(path)
    return path
