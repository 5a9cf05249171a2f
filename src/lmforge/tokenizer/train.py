"""Training a tokenizer from text with the `tokenizers` library trainers.

Four kinds of subword model, each with the pre-tokenisation and decoding that go with it:

    wordpiece      WordPiece (Wu et al. 2016; BERT): split on spaces and punctuation, "##" continuations
    bpe            BPE (Sennrich et al. 2016): split on spaces and punctuation, "</w>" ends a word
    bytelevel-bpe  byte-level BPE (GPT-2): every byte has a token, "Ġ" marks a leading space; lossless
    unigram        unigram LM (Kudo 2018; SentencePiece, T5): "▁" marks a leading space

and four families of special tokens and templates (the default follows the kind):

    bert     [PAD] [UNK] [CLS] [SEP] [MASK]    [CLS] A [SEP] B [SEP] (B with segment id 1)
    roberta  <s> <pad> </s> <unk> <mask>       <s> A </s></s> B </s>
    gpt2     <|endoftext|>                     no template
    t5       <pad> </s> <unk>                  A </s>; <extra_id_0..99> on top of vocab_size,
                                               <extra_id_0> the highest id (as T5 does)

The special tokens take the first ids, in the order listed.

The corpus (files, folders of them, or texts) is read as `corpus shard` reads it (sources.py), so
the tokenizer never learns ids that no shard holds.

Reproducibility: the same text and options give the same tokenizer.json in every process.
The trainers of tokenizers 0.23 number some pieces in hash-map order ("##c", "c</w>", Unigram's
required characters), which also breaks ties between equally frequent merges
(huggingface/tokenizers#1794); canonical.py says how each kind is pinned down, and the rare
cases left. WordPiece and BPE read the corpus twice for it (a first, merge-free pass finds the
pieces to pin), so texts from a one-shot iterator are held in memory.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from tokenizers import AddedToken, decoders, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE, Unigram, WordPiece

from lmforge.config.model import MAX_VOCAB
from lmforge.config.options import OptionsError, check_options, option
from lmforge.tokenizer.canonical import base_pieces, canonical
from lmforge.tokenizer.load import BERT_TOKENS, GPT2_TOKENS, ROBERTA_TOKENS, post_processor
from lmforge.tokenizer.sources import Corpus
from lmforge.tokenizer.wrapper import Tokenizer, TokenizerError

KINDS = ("wordpiece", "bpe", "bytelevel-bpe", "unigram")
DEFAULT_FAMILY = {"wordpiece": "bert", "bpe": "bert", "bytelevel-bpe": "roberta", "unigram": "t5"}
END_OF_WORD = "</w>"  # the suffix of the last piece of a word in plain BPE
N_SENTINELS = 100  # T5's <extra_id_*>


@dataclass(frozen=True)
class Family:
    """Special tokens (in id order), their roles and the template style of load.post_processor."""

    specials: tuple
    roles: dict
    style: str | None
    sentinels: int = 0


FAMILIES = {
    "bert": Family(("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"), BERT_TOKENS, "bert"),
    "roberta": Family(("<s>", "<pad>", "</s>", "<unk>", "<mask>"), ROBERTA_TOKENS, "roberta"),
    "gpt2": Family(("<|endoftext|>",), GPT2_TOKENS, None),
    "t5": Family(("<pad>", "</s>", "<unk>"), {"pad": "<pad>", "eos": "</s>", "unk": "<unk>"}, "t5",
                 N_SENTINELS),
}


def normalizer(lowercase: bool, strip_accents: bool):
    """Lower-casing and accent stripping (NFD, then drop the combining marks), only when asked."""
    steps = [normalizers.NFD(), normalizers.StripAccents()] if strip_accents else []
    steps += [normalizers.Lowercase()] if lowercase else []
    return normalizers.Sequence(steps) if steps else None


def backend_and_trainer(kind: str, vocab_size: int, family: Family, min_frequency: int, pinned=()) -> tuple:
    """An untrained backend (model, pre-tokenizer, decoder) and the trainer for it.

    `pinned` pieces follow the special tokens in the trainer's list, which gives them fixed ids
    (see canonical.py); `canonical` takes them out of the special tokens after training.
    """
    roles = family.roles
    # RoBERTa's <mask> takes the space before it: byte-level words carry their leading space
    lstrip = {roles["mask"]} if family.style == "roberta" else set()
    specials = [AddedToken(t, special=True, normalized=False, lstrip=t in lstrip) for t in family.specials]
    specials += [AddedToken(t, special=True, normalized=False) for t in pinned]
    common = {"vocab_size": vocab_size, "special_tokens": specials, "show_progress": False}
    unk = roles["unk"]
    if kind == "wordpiece":
        backend = Backend(WordPiece(unk_token=unk))
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        return backend, trainers.WordPieceTrainer(min_frequency=min_frequency, **common)
    if kind == "bpe":
        backend = Backend(BPE(unk_token=unk, end_of_word_suffix=END_OF_WORD))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        backend.decoder = decoders.BPEDecoder(suffix=END_OF_WORD)
        trainer = trainers.BpeTrainer(min_frequency=min_frequency, end_of_word_suffix=END_OF_WORD, **common)
        return backend, trainer
    if kind == "bytelevel-bpe":  # no unknown token: all 256 bytes are in the alphabet
        backend = Backend(BPE(fuse_unk=False))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        return backend, trainers.BpeTrainer(min_frequency=min_frequency,
                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), **common)
    backend = Backend(Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    return backend, trainers.UnigramTrainer(unk_token=unk, **common)


# the `tokenizers` trainers count in fixed-width integers: 1e20 overflowed them (a traceback); no corpus
# here repeats a pair a billion times
MAX_MIN_FREQUENCY = 1_000_000_000
DEFAULT_MIN_FREQUENCY = 2


@dataclass
class TokenizerOptions:
    """Options of `lmforge tokenizer train` and train_tokenizer: the algorithm, its size, its special tokens,
    the normalisation and the merges' least count."""

    kind: str = option("wordpiece", "the algorithm", choices=KINDS)
    # the `tokenizers` trainer aborts the process (a Rust panic) on a vocabulary of 1e10: ModelConfig's bound
    vocab_size: int = option(30522, "ids, special tokens included, the t5 family's 100 <extra_id_*> on top "
                             "(as T5's) (about: training may stop short); at least the specials and one "
                             "more, byte-level BPE's 256 bytes too", low=1, high=MAX_VOCAB)
    family: str | None = option(None, "special tokens and template", choices=tuple(FAMILIES), unset=", ".join(
        f"{family} for {kind}" for kind, family in DEFAULT_FAMILY.items()))
    lowercase: bool = option(False, "lower-case the text")
    strip_accents: bool = option(False, "NFD, then drop combining marks")
    min_frequency: int | None = option(None, "least count of a merged pair (BPE, WordPiece; unigram merges "
                                       "none)", low=1, high=MAX_MIN_FREQUENCY,
                                       unset=str(DEFAULT_MIN_FREQUENCY))

    def __post_init__(self) -> None:
        check_options(self)  # types, bounds and choices
        # byte-level BPE starts from the 256 bytes; the other kinds need room beyond the specials
        least = len(self.spec().specials) + (256 if self.kind == "bytelevel-bpe" else 1)
        if self.vocab_size < least:
            raise OptionsError(f"vocab_size must be an integer >= {least} for {self.kind} with "
                               f"{self.family_name()} special tokens, got {self.vocab_size}", "vocab_size")
        if self.kind == "unigram" and self.min_frequency is not None:  # not silently ignored
            raise OptionsError(f"min_frequency={self.min_frequency}: it counts the pairs BPE and WordPiece "
                               "merge; unigram merges none", "min_frequency")

    def family_name(self) -> str:
        """The family given, or the kind's own."""
        return self.family or DEFAULT_FAMILY[self.kind]

    def spec(self) -> Family:
        """The special tokens and template of the family."""
        return FAMILIES[self.family_name()]

    def merges_least(self) -> int:
        """min_frequency as the trainers take it (the default where none was given)."""
        return DEFAULT_MIN_FREQUENCY if self.min_frequency is None else self.min_frequency


def _run(backend: Backend, trainer, corpus: Corpus, kind: str) -> None:
    """Train `backend` in place on one pass over `corpus`."""
    try:
        corpus.train(backend, trainer)
    except (TokenizerError, TypeError):
        raise
    except Exception as err:  # the Rust trainers raise plain Exceptions
        # "stream did not contain valid UTF-8" names no file, "'utf-8' codec can't encode" no text: this does
        if "UTF-8" in str(err).upper():
            corpus.check_utf8()
        raise TokenizerError(f"cannot train a {kind} tokenizer: {err}") from None


def _pinned(kind: str, spec: Family, min_frequency: int, norm, corpus: Corpus) -> list:
    """The pieces whose ids WordPiece and BPE training must be given (canonical.py): what a
    merge-free pass (vocab_size 1) makes beyond the special tokens and the characters."""
    if kind not in ("wordpiece", "bpe"):
        return []
    backend, trainer = backend_and_trainer(kind, 1, spec, min_frequency)
    backend.normalizer = norm
    _run(backend, trainer, corpus, kind)
    return base_pieces(backend, spec.specials)


def _say_overflow(backend: Backend, options: TokenizerOptions) -> None:
    """A CorpusWarning where BPE or WordPiece training made more ids than vocab_size: their trainers keep
    every character of the corpus (WordPiece each as a "##" continuation too) whatever the size asked, then
    merge none; unigram refuses such a size itself."""
    from lmforge.data.corpus import CorpusWarning

    made = backend.get_vocab_size()
    if made > options.vocab_size:
        warnings.warn(f"vocab_size={options.vocab_size}: the corpus's characters alone make {made} ids, so "
                      f"the {options.kind} tokenizer has {made} and no merge; a vocab_size above {made} "
                      "gives merges", CorpusWarning, stacklevel=4)


def train_tokenizer(source, kind: str, vocab_size: int, family: str | None = None, lowercase: bool = False,
                    strip_accents: bool = False, min_frequency: int | None = None, read=None) -> Tokenizer:
    """Train a `kind` tokenizer of about `vocab_size` ids (specials included) on files or texts.

    `source` is a file path, a list of file paths or an iterable of texts (a text may hold
    many lines). The options are TokenizerOptions' (checked there: a bad one is an OptionsError naming
    it); `family` picks the special tokens and template (default: by kind, see the module docstring);
    `read` a ReadOptions: files read as `corpus shard` reads them with it (e.g. text_field="body").
    """
    options = TokenizerOptions(kind, vocab_size, family, lowercase, strip_accents, min_frequency)
    return train_with(source, options, read)


def train_with(source, options: TokenizerOptions, read=None) -> Tokenizer:
    """train_tokenizer with its options in one object (the command line builds it from its flags); read:
    a ReadOptions for files read as `corpus shard` reads them with it (a JSONL field, ...), None: defaults."""
    from lmforge.data.read_options import ReadOptions

    if read is not None and not isinstance(read, ReadOptions):
        raise OptionsError(f"read must be a ReadOptions, got {type(read).__name__}", "read")
    kind, spec, least = options.kind, options.spec(), options.merges_least()
    corpus, norm = Corpus(source, read), normalizer(options.lowercase, options.strip_accents)
    pinned = _pinned(kind, spec, least, norm, corpus)
    backend, trainer = backend_and_trainer(kind, options.vocab_size, spec, least, pinned)
    backend.normalizer = norm
    _run(backend, trainer, corpus, kind)
    _say_overflow(backend, options)
    backend = canonical(backend, spec.specials, pinned)
    tokens = dict(spec.roles)
    backend.add_special_tokens([AddedToken(f"<extra_id_{i}>", special=True, normalized=False)
                                for i in reversed(range(spec.sentinels))])
    processor = post_processor(backend, spec.style, tokens) if spec.style else None
    if processor is not None:
        backend.post_processor = processor
    return Tokenizer(backend, tokens)
