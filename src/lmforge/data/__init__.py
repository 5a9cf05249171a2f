"""Data: the built-in synthetic corpus, its probes and tasks; corpus reading, token shards, streaming."""
from lmforge.data.corpus import CorpusReader, CorpusWarning, ReadOptions
from lmforge.data.probes import probes, tasks
from lmforge.data.shards import shard_corpus
from lmforge.data.stream import ShardCorpus
from lmforge.data.synthetic import corpus_text, documents, write_corpus
from lmforge.data.world import World

__all__ = ["CorpusReader", "CorpusWarning", "ReadOptions", "ShardCorpus", "World", "corpus_text", "documents",
           "probes", "shard_corpus", "tasks", "write_corpus"]
