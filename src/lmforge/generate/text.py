"""The text that generated ids add after the ids before them, joined as the tokenizer joins them.

Decoded alone, new ids lose their join to the prompt: a WordPiece "##s" prints as "s" after a space
that decoding alone cannot know is not there, and a new word loses the space before it ("The city
ofParis"). So the new ids are decoded after the last ids of their context, and the context's own
text is cut off the front, as Hugging Face's text-generation pipeline does with the whole prompt.
The command line (cli/generate.py) and the server (serve/generation.py) both print this text, so
`lmforge generate` and /v1/completions give the same characters.
"""
from __future__ import annotations

JOIN_WINDOW = 16  # context ids decoded with the new ones: a join reads the last few only (a multi-byte
# character spans at most 4 byte-level tokens), and the per-step cost of streaming stays flat


class Continuation:
    """The text of ids generated one at a time after the ids `context` (a decoder's prompt; empty for an
    encoder-decoder's answer, which starts its own text): the context's window and the length of its
    text are found once, not at every token (the command line's and the server's streams). Each push
    decodes at most 3 x JOIN_WINDOW ids, not all the new ones (that made a long generation quadratic): the
    ids before the last JOIN_WINDOW are settled once their text is the front of the whole and the rest,
    decoded after its own window, is the remainder, as the context's window already assumes (a run of
    U+FFFD, invalid bytes, never settles: it is decoded whole, a failed settle tried once a window)."""

    def __init__(self, tokenizer, context=()) -> None:
        self.tokenizer, self.window = tokenizer, list(context)[-JOIN_WINDOW:]
        self.skip = len(tokenizer.decode(self.window)) if self.window else 0
        self.ids = []
        # the text of ids[:base], which later ids leave as it is; the window before ids[base:], its length
        self.settled, self.base, self.before = "", 0, (self.window, self.skip)
        self.failed, self.retry = 0, 0  # settles failed in a row; len(ids) at which one is tried again

    def push(self, token: int) -> str:
        """Add one id; the whole text the new ids make so far."""
        self.ids.append(token)
        window, skip = self.before
        text = self.settled + self.tokenizer.decode(window + self.ids[self.base:])[skip:]
        if len(self.ids) - self.base >= 2 * JOIN_WINDOW and len(self.ids) >= self.retry:
            self._settle(text)
        return text

    def _settle(self, text: str) -> None:
        """Settle the ids before the last JOIN_WINDOW where their text and the rest's add up to `text`; a
        join across the cut (cleanup's " ' "), or half a character at it, waits for a later step."""
        end, (window, skip) = len(self.ids) - JOIN_WINDOW, self.before
        front = self.settled + self.tokenizer.decode(window + self.ids[self.base:end])[skip:]
        before = self.ids[end - JOIN_WINDOW:end]
        after = len(self.tokenizer.decode(before))
        rest = self.tokenizer.decode(before + self.ids[end:])[after:]
        if front + rest == text and not front.endswith("\ufffd"):
            self.settled, self.base, self.before, self.failed = front, end, (before, after), 0
            return
        # more failures in a row than a character has bytes: a run of U+FFFD (invalid bytes, which never
        # settles); tried once a window, not with 3 more decodes at every id
        self.failed += 1
        self.retry = len(self.ids) + (JOIN_WINDOW if self.failed > 3 else 0)

    def text(self) -> str:
        """The text the new ids make after the context, joined as the tokenizer joins them."""
        return self.tokenizer.decode(self.window + self.ids)[self.skip:]


def continuation(tokenizer, context, new) -> str:
    """The text the ids `new` add after the ids `context` (see Continuation)."""
    joined = Continuation(tokenizer, context)
    joined.ids = list(new)
    return joined.text()


def tokenizer_ids(model, tokenizer) -> dict:
    """The ids a model's tokenizer supplies where its config names none, filled alike by the command line
    and the server: the stop id, and an encoder-decoder's pad (its decoder starts there when the config
    names no start: generate.checks)."""
    cfg, ids = model.config, {}
    if cfg.eos_token_id is None and tokenizer.eos_id is not None:
        ids["eos_token_id"] = tokenizer.eos_id
    if cfg.architecture == "encoder-decoder" and cfg.pad_token_id is None and tokenizer.pad_id is not None:
        ids["pad_token_id"] = tokenizer.pad_id
    return ids


def prompt_ids(tokenizer, text: str, encoder_decoder: bool) -> list:
    """A prompt's ids as the command line and the server generate from: an encoder-decoder's encoder reads
    the text in its tokenizer's template (T5: text </s>). A decoder continues the bare text, but after the
    BOS of a decoder's template, one that opens the text and closes nothing (Llama's and Mistral's <s>, as
    Hugging Face's text-generation pipeline gives it). A template that also closes the text (RoBERTa's
    <s> text </s>, BERT's [CLS] text [SEP]) is an encoder's: a decoder lmforge pretrained with one never
    read its BOS first (its text is read bare), nor does one with GPT-2's, which adds none."""
    whole = tokenizer.encode(text, add_special_tokens=True)
    if encoder_decoder:
        return whole.ids
    ids, read = whole.ids, whole.sequence_ids
    if len(ids) > 1 and ids[0] == tokenizer.bos_id and read[0] is None and read[-1] is not None:
        return ids
    return [i for i, which in zip(ids, read) if which is not None]  # the text's own tokens: the template's go
