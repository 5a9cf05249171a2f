"""generate/text.py: new ids' text joins the context's as the whole decoded text has it."""
import pytest

from lmforge.generate.text import JOIN_WINDOW, continuation
from tests.tasks.core import tokenizer


@pytest.mark.parametrize("family", ["bert", "gpt2", "t5"])
def test_the_text_of_new_ids_is_the_whole_text_less_the_context_s(family):
    tok = tokenizer(family)
    context = tok.encode("the film was long and the actors were good " * 4, add_special_tokens=False).ids
    new = tok.encode("the film", add_special_tokens=False).ids
    assert len(context) > JOIN_WINDOW  # the window, not the whole context, is decoded with the new ids
    whole = tok.decode(context + new)
    assert whole == tok.decode(context) + continuation(tok, context, new)
    assert continuation(tok, [], new) == tok.decode(new)  # an encoder-decoder's answer starts its own text


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_the_text_pushed_one_id_at_a_time_is_the_continuation_of_them_all(family):
    """The streams (command line, server) push one id at a time; the context's window is decoded once."""
    from lmforge.generate.text import Continuation

    tok = tokenizer(family)
    context = tok.encode("the film was long and the actors were good " * 4, add_special_tokens=False).ids
    new = tok.encode("the films", add_special_tokens=False).ids
    joined = Continuation(tok, context)
    texts = [joined.push(token) for token in new]
    assert texts == [continuation(tok, context, new[:i + 1]) for i in range(len(new))]
    assert joined.text() == texts[-1] and joined.ids == new


def _cleaning_wordpiece():
    """A WordPiece tokenizer whose decoder cleans up spaces across two tokens ("a ," -> "a,", "b ." -> "b.")
    and joins "##" pieces: both change the text of the id before the new one."""
    from tokenizers import Tokenizer, decoders, models

    words = ["[UNK]", "a", "'", "b", "##s", ",", "n", "##t", "t", ".", "s", "re", "?", "!"]
    backend = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.decoder = decoders.WordPiece(cleanup=True)
    backend.vocab_size = len(words)
    return backend


def _byte_level():
    """A byte-level BPE (GPT-2's decoder) of texts with 2-, 3- and 4-byte characters: its single bytes are
    halves of characters, which a later id completes (tests.tasks.core's "gpt2" is a BPE of whole symbols)."""
    from lmforge.tokenizer import train_tokenizer

    texts = ["the café was naïve, the crème brûlée good: 日本語のテキスト 😀 🎉 Zürich русский 中文 " * 3] * 8
    return train_tokenizer(texts, "bytelevel-bpe", 400, family="gpt2")


@pytest.mark.parametrize("family", ["bert", "gpt2", "t5", "cleanup", "bytelevel"])
@pytest.mark.parametrize("prompt", ["the film was long and the actors were good " * 4, ""])
def test_a_long_run_pushed_one_id_at_a_time_is_the_whole_text_at_every_step(family, prompt):
    """Pushes settle the text of all but the last ids: at every step it is still the whole decoding's,
    for arbitrary ids (byte-level halves of characters, WordPiece joins, cleanup joining a token to the one
    before), after a prompt and after none (an encoder-decoder's answer)."""
    import random

    from lmforge.generate.text import Continuation

    tok = {"cleanup": _cleaning_wordpiece, "bytelevel": _byte_level}.get(family, lambda: tokenizer(family))()
    context = [] if not prompt else tok.encode(prompt).ids if family == "cleanup" else \
        tok.encode(prompt, add_special_tokens=False).ids
    rng = random.Random(0)
    low = min(256, tok.vocab_size)  # byte-level: single bytes, often half a character
    new = [rng.randrange(tok.vocab_size) for _ in range(200)] + [rng.randrange(low) for _ in range(100)]
    joined = Continuation(tok, context)
    texts = [joined.push(token) for token in new]
    assert texts == [continuation(tok, context, new[:i + 1]) for i in range(len(new))]
    assert joined.base > 0  # settled: the later steps decoded only the last ids
    if family == "bytelevel":  # half a character at a step's end, made whole by a later id
        assert any(a.endswith("\ufffd") and not b.startswith(a) for a, b in zip(texts, texts[1:]))


def test_a_push_decodes_a_bounded_number_of_ids_however_long_the_text():
    """Every push had decoded all the new ids (and `lmforge generate --stop` pushes each one): quadratic
    in the text's length. Now a push decodes at most 3 x JOIN_WINDOW ids."""
    from lmforge.generate.text import Continuation

    tok, decoded = tokenizer("gpt2"), []

    class Counting:
        def decode(self, ids):
            decoded.append(len(ids))
            return tok.decode(ids)

    new = tok.encode("the film was long and the actors were good " * 30, add_special_tokens=False).ids
    joined = Continuation(Counting(), new[:20])
    texts = [joined.push(token) for token in new]
    assert len(new) > 10 * JOIN_WINDOW and texts[-1] == continuation(tok, new[:20], new)
    assert max(decoded) <= 3 * JOIN_WINDOW


def test_a_decoder_prompt_keeps_its_templates_leading_bos_and_never_a_closing_token():
    """A converted Llama's tokenizer puts <s> before the text, as Hugging Face's text-generation pipeline
    feeds it: the command line and the server had sent the bare text, so a converted Llama continued
    another input than the reference's, silently. A closing </s> (T5's, BERT's [SEP]) is never sent."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers, processors

    from lmforge.generate.text import prompt_ids
    from lmforge.tokenizer import Tokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "the": 3, "cat": 4}
    for template, roles in (("<s> $A", {"bos": "<s>"}), ("$A </s>", {"eos": "</s>"}),
                            ("<s> $A </s>", {"bos": "<s>", "eos": "</s>"}), ("$A", {})):
        backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        backend.post_processor = processors.TemplateProcessing(single=template,
                                                               special_tokens=[("<s>", 1), ("</s>", 2)])
        tok = Tokenizer(backend, {"unk": "<unk>", **roles})
        lead = [1] if template == "<s> $A" else []  # an encoder's template (<s> text </s>): the bare text
        assert prompt_ids(tok, "the cat", encoder_decoder=False) == [*lead, 3, 4], template
        # the whole template
        assert prompt_ids(tok, "the cat", encoder_decoder=True) == tok.encode("the cat").ids
    for family in ("gpt2", "t5", "bert", "roberta"):  # lmforge's own: GPT-2's none, the others close the text
        tok = tokenizer(family)
        bare = tok.encode("the film", add_special_tokens=False).ids
        assert prompt_ids(tok, "the film", False) == bare


def test_a_run_that_never_settles_is_tried_once_a_window_not_at_every_id():
    """A run of invalid bytes (U+FFFD each: an untrained model's output) never settles: each push had tried,
    3 more decodes of the growing run at every id; after more failures than a character has bytes it
    tries once a window, and the texts are still the whole decoding's."""
    from lmforge.generate.text import Continuation

    tok, decoded = _byte_level(), []

    class Counting:
        def decode(self, ids):
            decoded.append(len(ids))
            return tok.decode(ids)

    junk = next(i for i in range(tok.vocab_size) if tok.decode([i, i]) == "\ufffd\ufffd")
    joined = Continuation(Counting(), [])
    texts = [joined.push(junk) for _ in range(200)]
    assert texts[-1] == "\ufffd" * 200 and joined.base == 0
    assert len(decoded) < 1.3 * 200  # one decode a push, and a failed settle's 3 once a window
