import pytest
import torch

import lmforge
from lmforge.data.gpt_format import (TaskTokens, add_task_tokens, classification, entailment, grow_vocabulary,
                                     multiple_choice, similarity)
from lmforge.heads import make_head
from lmforge.tokenizer import train_tokenizer

T = TaskTokens(start=90, delim=91, extract=92)


def test_formats_follow_gpt_figure_1():
    assert classification([5, 6, 7], T) == [90, 5, 6, 7, 92]
    assert entailment([5, 6], [7], T) == [90, 5, 6, 91, 7, 92]
    assert similarity([5, 6], [7], T) == [[90, 5, 6, 91, 7, 92], [90, 7, 91, 5, 6, 92]]  # both orders
    assert multiple_choice([5, 6], [[7], [8, 9]], T) == [[90, 5, 6, 91, 7, 92], [90, 5, 6, 91, 8, 9, 92]]
    with pytest.raises(ValueError, match="answer"):
        multiple_choice([5], [], T)


def test_truncation_cuts_the_longest_part_and_keeps_the_special_tokens():
    assert classification(list(range(10, 20)), T, max_len=6) == [90, 10, 11, 12, 13, 92]
    out = entailment(list(range(10, 20)), [30, 31], T, max_len=8)
    assert out == [90, 10, 11, 12, 91, 30, 31, 92] and len(out) == 8
    assert all(len(s) == 8 for s in multiple_choice(list(range(10, 30)), [[1, 2], [3]], T, max_len=8))
    with pytest.raises(ValueError, match="no room"):
        entailment([5], [6], T, max_len=2)


def test_task_tokens_join_a_tokenizer_and_the_model_grows_to_fit(tmp_path):
    texts = ["the film was great", "the film was awful", "a fine day in the park"] * 10
    tok = train_tokenizer(texts, "bytelevel-bpe", 300, family="gpt2")
    before = tok.vocab_size
    ids = add_task_tokens(tok)
    assert (ids.start, ids.delim, ids.extract) == (before, before + 1, before + 2)
    assert add_task_tokens(tok) == ids and tok.vocab_size == before + 3  # adding again changes nothing
    encoded = tok.encode("[START] the film [DELIM] was great [EXTRACT]").ids
    assert encoded[0] == ids.start and encoded[-1] == ids.extract and ids.delim in encoded  # never split
    assert tok.decode(encoded) == " the film  was great "  # special tokens are skipped when decoding

    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("gpt2"), vocab_size=before)
    old = model.tokens.weight.detach().clone()
    grow_vocabulary(model, tok.vocab_size)
    assert model.config.vocab_size == tok.vocab_size and torch.equal(model.tokens.weight[:before], old)
    head = model.add_head("lm", make_head(model, "lm"))
    assert head.tied is model.tokens  # the tied LM head projects onto the grown table
    seq = torch.tensor([classification(tok.encode("the film was great").ids, ids)])
    assert model(seq).logits.shape == (1, seq.shape[1], tok.vocab_size)
    model.save(tmp_path)
    assert lmforge.load(tmp_path).config.vocab_size == tok.vocab_size
    with pytest.raises(ValueError, match="smaller"):
        grow_vocabulary(model, before)


def test_growing_an_untied_lm_head_with_a_bias():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bart-base"), tie_embeddings=False)
    head = model.add_head("lm", make_head(model, "lm"))
    old = head.decoder.weight.detach().clone()
    grow_vocabulary(model, 105)
    assert head.decoder.weight.shape[0] == 105 and head.bias.shape == (105,)
    assert torch.equal(head.decoder.weight[:99], old) and head.bias[99:].eq(0).all()
