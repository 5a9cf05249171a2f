"""The options of the retrieval jobs (`lmforge index build`, `lmforge retrieve` and its reader, realm, ict
and rag training), one typed object each: the command line builds its flags from these fields and the Python
API (retrieval/jobs.py) takes the objects, so both accept and refuse alike. Training options (steps,
batch size, ...) are TrainConfig's; how texts become vectors, EncoderOptions'.
"""
from __future__ import annotations

from dataclasses import dataclass

from lmforge.config.options import OptionsError, check_options, instance_of, option, with_changes
from lmforge.generate.options import GenerationOptions
from lmforge.retrieval.passages import MAX_WORDS, WORDS
from lmforge.retrieval.rag_decode import DECODINGS, check_fast

ANSWER_PIECES = 16  # of a training answer, its [SEP] included (rag_train.rag_examples cuts to this)

METHODS = ("dense", "bm25")
BACKENDS = ("torch", "faiss")
MAX_CANDIDATES = 1000  # passages one query's reranking scores
MAX_READ = 1000  # passages a reader reads for one question (in one batch)
MAX_HARD_NEGATIVES = 1000  # BM25 hard negatives per training question of retrieve train (n_hard)
MAX_QUERIES = 65_536  # queries of one query_index call: each holds k results with their texts
MAX_QUERY_CHARS = 65_536  # characters of one query: tokenized whole before a dense encoder cuts it
# tokens RAG's generator holds in one pass (rows x (max_len + max_new_tokens)): each of k, num_beams,
# max_len and the batch is bounded alone, and their product is what memory pays for
MAX_GENERATOR_TOKENS = 1 << 22
MAX_GENERATOR_LOGITS = 1 << 31  # its scores of answer tokens over the vocabulary (8 GiB in fp32)


@dataclass(frozen=True)
class IndexOptions:
    """An index directory's passages (the corpus cut into windows of words) and how they are embedded."""

    words: int = option(WORDS, "words per passage", low=1, high=MAX_WORDS)
    batch_size: int = option(64, "passages embedded at once", low=1, high=65536)

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class QueryOptions:
    """A query against an index: how many passages, found how, and how many a reranker re-orders."""

    k: int = option(5, "passages per query", low=1, high=1_000_000)
    method: str = option("dense", "dense (the index's encoder) or bm25", choices=METHODS)
    backend: str = option("torch", "the dense search: torch (exact) or faiss", choices=BACKENDS)
    candidates: int | None = option(None, "passages retrieved for the reranker to re-order",
                                    low=1, high=MAX_CANDIDATES, unset="k")

    def __post_init__(self) -> None:
        check_options(self)
        if self.candidates is not None and self.candidates < self.k:
            raise OptionsError(f"candidates={self.candidates} must be at least k ({self.k})", "candidates")
        if self.method == "bm25" and self.backend != "torch":  # never ignored: only dense search has one
            raise OptionsError(f"backend={self.backend}: a backend of the dense search; method bm25 searches "
                               "words, not vectors", "backend")


@dataclass(frozen=True)
class ReaderOptions:
    """DPR's extractive reader: how many passages it reads and what it trains on."""

    k: int = option(5, "passages read per test question", low=1, high=MAX_READ)
    negatives: int = option(3, "BM25 negatives per training question", low=1, high=100)
    max_len: int = option(128, "tokens of question + passage (at most the model's max_seq_len)", low=16,
                          high=8192)

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class RealmOptions:
    """REALM pretraining: documents retrieved per input, how often the index is rebuilt, the input size."""

    k: int = option(4, "documents retrieved per masked input (0: the null document only)", low=0, high=1000)
    refresh_every: int = option(50, "training forward passes between rebuilds of the document index", low=1,
                                high=1_000_000)
    max_len: int = option(192, "tokens of [CLS] x [SEP] z [SEP] (at most the model's max_seq_len)", low=8,
                          high=8192)
    null_document: bool = option(True, "also read the empty document (REALM's null document)")

    def __post_init__(self) -> None:
        check_options(self)
        if self.k == 0 and not self.null_document:
            raise OptionsError("k=0 with null_document=false leaves no document to read", "null_document")


@dataclass(frozen=True)
class IctOptions:
    """The inverse cloze task: how its pseudo-questions are drawn, and the encoders it trains."""

    keep: float = option(0.1, "probability the sentence stays in its context (ORQA: 0.1)", low=0.0, high=1.0)
    rounds: int = option(4, "pseudo-questions drawn per passage", low=1, high=1000)
    separate: bool = option(True, "separate encoders for sentences and contexts (REALM's Embed_input and "
                                  "Embed_doc)")

    def __post_init__(self) -> None:
        check_options(self)


def _as_generate(name: str, default: int, doc: str):
    """An option bounded as generate's GenerationOptions declares `name` (its bounds, not a copy of them)."""
    declared = GenerationOptions.__dataclass_fields__[name].metadata
    return option(default, doc, low=declared["low"], high=declared["high"])


@dataclass(frozen=True)
class RagOptions:
    """RAG (Lewis et al. 2020): its marginalisation, the passages it reads, the question encoder's share of
    the learning rate, and how the test answers are decoded (sec. 2.5; bounded as generate's options)."""

    kind: str = option("token", "RAG-Token (passages marginalised per token) or RAG-Sequence (per answer)",
                       choices=("token", "sequence"))
    k: int = option(5, "passages retrieved per question (0: closed-book, the question alone)", low=0,
                    high=MAX_READ)
    max_len: int = option(96, "tokens of [CLS] passage [SEP] question [SEP] (at most the generator's "
                          "max_seq_len)", low=16, high=8192)
    question_lr_scale: float = option(0.05, "the question encoder's learning rate, a share of lr (0: kept "
                                      "fixed; the passage index is fixed always)", low=0.0, high=1.0)
    num_beams: int = _as_generate("num_beams", 1, "beams of the test answers' decoding; 1: greedy")
    decoding: str = option("thorough", "RAG-Sequence's Thorough or Fast Decoding (RAG-Token: thorough)",
                           choices=DECODINGS)
    max_new_tokens: int = _as_generate("max_new_tokens", 8, "tokens of a test answer at most")

    def __post_init__(self) -> None:
        check_options(self)  # the counts by generate's bounds, decoding by its choices (as check_decoding)
        check_fast(self.decoding, self.kind)


def options_of(cls, options):
    """`options` checked to be a `cls` (None: its defaults); anything else is an OptionsError naming it."""
    return with_changes(cls, options, None, cls.__name__)


def job_config(name: str, cfg):
    """`cfg`, the training job `name`'s TrainConfig, after one_process(name) (the job runs in one process)
    and an OptionsError naming cfg where it is no TrainConfig (a dict of its fields is not read as one)."""
    from lmforge.train.config import TrainConfig
    from lmforge.utils.ranks import one_process

    one_process(name)
    return instance_of(cfg, TrainConfig, "cfg", optional=False)


def generator_passes(options: RagOptions, batch_size: int) -> tuple:
    """RAG's generator passes as (rows, answer tokens a row): training's, a batch's questions x k passages
    with an answer of ANSWER_PIECES; decoding's, a batch's questions x k x num_beams (or, in Thorough
    Decoding, one question's k x k x num_beams candidate rows, if more) with max_new_tokens."""
    k = max(1, options.k)  # k 0: the question alone, one row
    rows = batch_size * k * options.num_beams
    if options.kind == "sequence" and options.decoding == "thorough":
        rows = max(rows, k * k * options.num_beams)
    return (batch_size * k, ANSWER_PIECES), (rows, options.max_new_tokens)


def generator_tokens(options: RagOptions, batch_size: int) -> int:
    """Tokens RAG's generator holds in its largest pass: each row's max_len input and its answer."""
    return max(rows * (options.max_len + answer) for rows, answer in generator_passes(options, batch_size))


def check_rag_cost(options: RagOptions, batch_size: int, vocab_size: int = 0) -> None:
    """An OptionsError naming k where the generator's largest pass holds more than MAX_GENERATOR_TOKENS
    tokens, or (its vocabulary known) more than MAX_GENERATOR_LOGITS scores of answer tokens."""
    tokens = generator_tokens(options, batch_size)
    logits = max(rows * answer for rows, answer in generator_passes(options, batch_size)) * vocab_size
    said = (f"k={options.k} with num_beams={options.num_beams}, batch_size={batch_size}, "
            f"max_len={options.max_len} and max_new_tokens={options.max_new_tokens}")
    hint = "lower k, num_beams, batch_size, max_len or max_new_tokens"
    if tokens > MAX_GENERATOR_TOKENS:
        raise OptionsError(f"{said}: {tokens:,} generator tokens in one pass, more than "
                           f"{MAX_GENERATOR_TOKENS:,}; {hint}", "k")
    if logits > MAX_GENERATOR_LOGITS:
        raise OptionsError(f"{said}: {logits:,} scores of answer tokens over the generator's {vocab_size:,} "
                           f"ids in one pass, more than {MAX_GENERATOR_LOGITS:,}; {hint}", "k")
