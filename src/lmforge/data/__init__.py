"""Data: the built-in synthetic corpus, its probes and tasks (corpus readers and shards follow)."""
from lmforge.data.probes import probes, tasks
from lmforge.data.synthetic import corpus_text, documents, write_corpus
from lmforge.data.world import World

__all__ = ["World", "corpus_text", "documents", "probes", "tasks", "write_corpus"]
