import pytest
import torch

import lmforge
from lmforge.config import ConfigError
from lmforge.heads import attach, make_head, pool


def _model(name="bert-base", **kw):
    return lmforge.build(lmforge.tiny(name, **kw)).eval()


def test_tied_lm_head_shares_the_token_table():
    model = _model()
    head = attach(model, "lm")
    assert "heads.lm.decoder.weight" not in model.state_dict()
    with torch.no_grad():
        model.tokens.weight[5] += 1.0
    hidden = torch.randn(3, 32)
    expected = head.norm(head.act(head.transform(hidden))) @ model.tokens.weight.T + head.bias
    torch.testing.assert_close(head(hidden), expected)


def test_albert_lm_head_projects_to_the_embedding_size():
    model = _model("albert-base")
    head = attach(model, "lm")
    assert head.transform.out_features == model.config.embed_dim == 16
    assert head(torch.randn(2, 5, 32)).shape == (2, 5, 99)


def test_t5_scales_before_the_tied_projection():
    model = _model("t5-small")
    head = attach(model, "lm")
    hidden = torch.randn(4, 32)
    torch.testing.assert_close(head(hidden), (hidden * 32 ** -0.5) @ model.tokens.weight.T)


def test_untied_head_owns_its_projection():
    model = _model("mistral-7b")
    attach(model, "lm")
    assert model.state_dict()["heads.lm.decoder.weight"].shape == (99, 32)


def test_pooling_first_last_mean():
    hidden = torch.arange(2 * 4 * 1.0).view(2, 4, 1)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])  # right and left padding
    assert pool(hidden, mask, "first").flatten().tolist() == [0, 4]
    assert pool(hidden, mask, "last").flatten().tolist() == [2, 7]
    assert pool(hidden, mask, "mean").flatten().tolist() == [1, 6]


def test_task_heads_shapes():
    model = _model()
    attach(model, "classification", n_labels=3)
    attach(model, "token-classification", n_labels=5)
    attach(model, "span-qa")
    attach(model, "pooler")
    ids, mask = torch.randint(0, 99, (2, 7)), torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    out = model(ids, mask)
    assert out.logits.shape == (2, 3)
    assert out.head_outputs["token-classification"].shape == (2, 7, 5)
    assert out.head_outputs["pooler"].shape == (2, 32)
    span = out.head_outputs["span-qa"]
    assert span.shape == (2, 7, 2) and (span[1, 5:] < -1e30).all()


def test_decoder_classifies_from_the_last_token():
    model = _model("gpt2")
    head = attach(model, "classification", n_labels=2, pooling="last", pooler=False)
    ids = torch.randint(0, 99, (1, 6))
    full = model(ids).logits
    torch.testing.assert_close(full, head.classifier(model(ids).last_hidden_state[:, -1]))


def test_bad_head_arguments():
    model = _model()
    with pytest.raises(ConfigError, match="head kind 'crf' is not one of"):
        make_head(model, "crf")
    with pytest.raises(ConfigError, match="pooling='max'"):
        make_head(model, "pooler", pooling="max")
    with pytest.raises(ConfigError, match="n_labels must be an integer >= 1 and <= 4194304, got 0"):
        make_head(model, "classification", n_labels=0)


def test_pooler_lm_and_rtd_activations_follow_the_config():
    model = _model("bert-base", pooler_activation="relu", ffn="relu", lm_activation="gelu")
    pooler, lm, rtd = attach(model, "pooler"), attach(model, "lm"), attach(model, "rtd")
    hidden = torch.randn(2, 5, 32)
    torch.testing.assert_close(pooler(hidden), torch.relu(pooler.dense(hidden[:, 0])))
    expected = lm.norm(torch.nn.functional.gelu(lm.transform(hidden))) @ model.tokens.weight.T + lm.bias
    torch.testing.assert_close(lm(hidden), expected)
    assert rtd(hidden).shape == (2, 5)  # one replaced-token logit per position
    torch.testing.assert_close(rtd(hidden), rtd.score(torch.relu(rtd.dense(hidden))).squeeze(-1))


def test_run_heads_false_returns_hidden_states_only():
    import lmforge

    model = lmforge.build(lmforge.tiny("bert-base")).eval()
    attach(model, "lm")
    ids = torch.randint(0, 99, (2, 5))
    with torch.no_grad():
        full, bare = model(ids), model(ids, run_heads=False)
    assert bare.logits is None and bare.head_outputs == {}
    assert torch.equal(bare.last_hidden_state, full.last_hidden_state)


@pytest.mark.parametrize("args, field", [
    ({"n_labels": True}, "n_labels"),
    ({"n_labels": 2.5}, "n_labels"),
    ({"n_labels": None}, "n_labels"),
    ({"n_labels": 10**12}, "n_labels"),
    ({"n_labels": 2, "bogus": 1}, "bogus"),
    ({"n_labels": 2, "pooler": "no"}, "pooler"),
])
def test_a_head_argument_of_the_wrong_kind_is_a_config_error_naming_it(args, field):
    """A bool n_labels was read as 1, 2.5 or None failed inside torch, 10**12 tried to allocate 128 TB and an
    unknown keyword was Python's TypeError."""
    model = lmforge.build(lmforge.tiny("bert-tiny"))
    with pytest.raises(ConfigError) as caught:
        attach(model, "classification", **args)
    assert caught.value.field == field and field in str(caught.value) and not model.heads


@pytest.mark.parametrize("model, kind, name, field", [
    (None, "lm", None, "model"), ("bert-tiny", "lm", None, "model"), (True, ["lm"], None, "kind"),
    (True, "lm", 3, "name"), (True, "lm", "a.b", "name")])
def test_attach_to_no_model_or_under_no_name_is_a_config_error_naming_it(model, kind, name, field):
    """None as the model was an AttributeError, a list as the kind "unhashable", a number or dotted name
    torch's TypeError/KeyError."""
    built = lmforge.build(lmforge.tiny("bert-tiny"))
    with pytest.raises(ConfigError) as caught:
        attach(built if model is True else model, kind, name=name)
    assert caught.value.field == field and not built.heads


def test_an_elmo_that_inherits_tie_embeddings_gets_its_own_softmax_weights():
    """bert-base's fields made an ELMo with tie_embeddings=True (ModelConfig's default): its LM head was an
    AttributeError ('ELMo' object has no attribute 'tokens'); an ELMo has no token table to tie to."""
    cfg = lmforge.tiny("bert-base", architecture="elmo", lstm_dim=64, char_embed_dim=8,
                       char_filters=[[1, 8], [2, 8], [3, 16]])
    assert cfg.tie_embeddings
    model = lmforge.build(cfg).eval()
    head = attach(model, "lm")
    assert head.decoder.weight.shape == (99, 32) and "heads.lm.decoder.weight" in model.state_dict()
    with torch.no_grad():
        states = model(torch.randint(1, 262, (2, 4, cfg.max_characters_per_token))).forward_states[-1]
        logits = head(states)
    assert logits.shape == (2, 4, 99) and torch.isfinite(logits).all()


@pytest.mark.parametrize("tied", [True, False])
def test_t5_s_lm_head_scales_its_features_by_d_model_to_the_minus_half_tied_or_not(tied):
    """The reference's rule (T5ForConditionalGeneration, scale_decoder_outputs): the decoder's output times
    d_model**-0.5 before lm_head, whether lm_head is the token table or a checkpoint's own matrix."""
    model = _model("t5-small", tie_embeddings=tied)
    head = attach(model, "lm")
    weight = model.tokens.weight if tied else head.decoder.weight
    assert (head.decoder is None) == tied
    hidden = torch.randn(3, 32)
    torch.testing.assert_close(head(hidden), (hidden * 32 ** -0.5) @ weight.T)


def test_an_elmo_that_inherits_t5_s_logit_scale_computes_the_logits_its_sampled_softmax_does():
    """T5's fields made an ELMo with tied_logit_scale=True: its full softmax (evaluation) scaled the states
    by d_model**-0.5, which no ELMo preset's softmax does (the sampled one reads the same features())."""
    cfg = lmforge.tiny("t5-small", architecture="elmo", lstm_dim=64, char_embed_dim=8,
                       char_filters=[[1, 8], [2, 8], [3, 16]])
    assert cfg.tied_logit_scale
    model = lmforge.build(cfg).eval()
    head = attach(model, "lm")
    with torch.no_grad():
        states = model(torch.randint(1, 262, (2, 4, cfg.max_characters_per_token))).forward_states[-1]
        torch.testing.assert_close(head(states), torch.nn.functional.linear(states, *head.projection()))
