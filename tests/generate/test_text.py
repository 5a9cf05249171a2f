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
