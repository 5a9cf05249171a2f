"""Helpers for parity against the reference library (tiny random models, nothing downloaded)."""
import json

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")


def save_reference(model, path):
    """Save a reference model the way users receive them (config.json + safetensors)."""
    model.eval().save_pretrained(path)
    return path


def load_reference(reference, path):
    """Save the reference into path and read it back with lmforge.load."""
    import lmforge

    return lmforge.load(save_reference(reference, path))


def confident_gpt2(vocab: int, seed: int):
    """A tiny reference GPT-2 (2 layers, width 32, pad 0, no stop token) drawn from `seed`, its final norm
    scaled so that greedy scores are far from ties (decoding tests compare tokens, not scores)."""
    torch.manual_seed(seed)
    reference = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
        eos_token_id=None, pad_token_id=0)).eval()
    with torch.no_grad():
        reference.transformer.ln_f.weight.mul_(8.0)
        reference.transformer.ln_f.bias.mul_(8.0)
    return reference


def padded_batch(vocab: int, lengths=(9, 6, 3), seed: int = 0, pad: int | None = None):
    """(B, T) ids and a right-padded attention mask (with `pad` at the padded positions when given)."""
    gen = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), T), generator=gen)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    return (ids if pad is None else ids.masked_fill(mask == 0, pad)), mask


def left_padded_batch(vocab: int, lengths=(7, 4, 2), pad: int = 1, seed: int = 0):
    """(B, T) ids with `pad` before each prompt, and the left-padded attention mask (generation)."""
    gen = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(pad + 2, vocab, (len(lengths), T), generator=gen)
    mask = (torch.arange(T)[None] >= T - torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, pad), mask


def shift_right(labels, start: int, pad: int):
    """An encoder-decoder's decoder inputs: labels shifted right behind `start`, -100 read as pad."""
    shifted = torch.cat([torch.full_like(labels[:, :1], start), labels[:, :-1]], dim=1)
    return shifted.masked_fill(shifted == -100, pad)


def assert_parity(ours, theirs, mask=None):
    """fp32 parity: absolute 1e-5, relative 1e-4 (at real positions when a mask is given)."""
    if mask is not None:
        keep = mask.bool()
        ours, theirs = ours[keep], theirs[keep]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def assert_same_state_dict(want, got):
    """Two modules hold the same tensor names with bit-equal values."""
    want, got = want.state_dict(), got.state_dict()
    assert sorted(want) == sorted(got)
    assert all(torch.equal(want[k], got[k]) for k in want)


def assert_forward_parity(model, reference, ids, mask, output="logits", per_token=True):
    """model(ids, mask).<output> equals the reference's (at real positions when per_token)."""
    with torch.no_grad():
        ours = getattr(model(ids, mask), output)
        theirs = getattr(reference(ids, attention_mask=mask), output)
    assert_parity(ours, theirs, mask if per_token else None)


def assert_loss_parity(logits, labels, loss, **tolerance):
    """Cross-entropy against labels ((B, T): per token) equals `loss`, at 1e-5/1e-4 unless told otherwise."""
    ours = F.cross_entropy(logits.flatten(0, 1) if labels.dim() == 2 else logits, labels.flatten())
    torch.testing.assert_close(ours, loss, **(tolerance or {"atol": 1e-5, "rtol": 1e-4}))


def assert_logits_and_loss_parity(model, reference, ids, mask, labels, **loss_tolerance):
    """Logits and the cross-entropy loss given labels ((B, T) labels: per token, at real positions)."""
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels)
        ours = model(ids, mask).logits
    assert_parity(ours, theirs.logits, mask if labels.dim() == 2 else None)
    assert_loss_parity(ours, labels, theirs.loss, **loss_tolerance)


def assert_masked_lm_parity(model, reference, ids, mask, labels, segments=None):
    """Last hidden states, logits and the token loss of a masked LM (with segments when given)."""
    segment_kw = {} if segments is None else {"token_type_ids": segments}
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels, output_hidden_states=True, **segment_kw)
        ours = model(ids, mask, segment_ids=segments)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.logits, theirs.logits, mask)
    assert_loss_parity(ours.logits, labels, theirs.loss)


# sentence-pair head -> (the reference's label argument, its logits field)
_PAIR_HEADS = {"nsp": ("next_sentence_label", "seq_relationship_logits"),
               "sop": ("sentence_order_label", "sop_logits")}


def assert_pretraining_parity(model, reference, ids, mask, segments, labels, pair_labels, pair_head="nsp"):
    """Hidden states, MLM and sentence-pair (nsp or sop) logits and the summed loss of a pretraining model."""
    label_argument, logits_field = _PAIR_HEADS[pair_head]
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, token_type_ids=segments, labels=labels,
                           output_hidden_states=True, **{label_argument: pair_labels})
        ours = model(ids, mask, segment_ids=segments)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.head_outputs["lm"], theirs.prediction_logits, mask)
    assert_parity(ours.head_outputs[pair_head], getattr(theirs, logits_field))
    loss = (F.cross_entropy(ours.head_outputs["lm"].flatten(0, 1), labels.flatten())
            + F.cross_entropy(ours.head_outputs[pair_head], pair_labels))
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def assert_pooler_parity(model, reference, ids, mask):
    """A bare encoder's last hidden states (at real positions) and its pooler output."""
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask)
    assert_parity(ours.last_hidden_state, theirs.last_hidden_state, mask)
    assert_parity(ours.head_outputs["pooler"], theirs.pooler_output)


def assert_span_logits_parity(ours, theirs, mask):
    """(B, T, 2) span logits equal the reference's start and end logits at real positions."""
    assert_parity(ours[..., 0], theirs.start_logits, mask)
    assert_parity(ours[..., 1], theirs.end_logits, mask)


def assert_span_loss_parity(ours, starts, ends, loss):
    """The mean of the start and end cross-entropies of (B, T, 2) span logits equals the reference's loss."""
    ours = (F.cross_entropy(ours[..., 0], starts) + F.cross_entropy(ours[..., 1], ends)) / 2
    torch.testing.assert_close(ours, loss, atol=1e-5, rtol=1e-4)


def assert_question_answering_parity(model, reference, ids, mask, full=None, starts=None, ends=None):
    """Span logits on a padded batch and, given unpadded `full` ids and answers, the span loss."""
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask)
        ours = model(ids, mask).logits  # lmforge masks padding out of the answer
    assert_span_logits_parity(ours, theirs, mask)
    if full is None:
        return
    with torch.no_grad():
        theirs = reference(full, start_positions=starts, end_positions=ends)
        ours = model(full).logits
    assert_span_loss_parity(ours, starts, ends, theirs.loss)


def assert_seq2seq_parity(model, reference, ids, mask, labels, decoder_ids, decoder_mask):
    """Encoder and decoder hidden states, logits and the loss of an encoder-decoder given labels."""
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels, decoder_attention_mask=decoder_mask,
                           output_hidden_states=True)
        ours = model(ids, mask, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask)
    assert_parity(ours.encoder_last_hidden_state, theirs.encoder_last_hidden_state, mask)
    assert_parity(ours.last_hidden_state, theirs.decoder_hidden_states[-1], decoder_mask)
    assert_parity(ours.logits, theirs.logits, decoder_mask)
    loss = F.cross_entropy(ours.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def assert_bare_seq2seq_parity(model, reference, ids, mask, decoder_ids, decoder_mask):
    """A headless encoder-decoder: its decoder and encoder last hidden states at real positions."""
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, decoder_input_ids=decoder_ids,
                           decoder_attention_mask=decoder_mask)
        ours = model(ids, mask, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask)
    assert not model.heads
    assert_parity(ours.last_hidden_state, theirs.last_hidden_state, decoder_mask)
    assert_parity(ours.encoder_last_hidden_state, theirs.encoder_last_hidden_state, mask)


def assert_seq2seq_greedy_parity(model, reference, ids, mask, pad, max_new_tokens=20):
    """Greedy seq2seq tokens equal reference.generate's, again with row 0's token 3 as eos; returns run 1."""
    import lmforge

    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False)
        free = lmforge.generate(model, ids, attention_mask=mask, max_new_tokens=max_new_tokens)
        assert torch.equal(free, theirs)
        stop = int(theirs[0, 3])
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                    eos_token_id=stop)
        ours = lmforge.generate(model, ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                eos_token_id=stop)
    assert ours[0, 4:].eq(pad).all()
    assert torch.equal(ours, theirs)
    return free


def assert_greedy_parity(model, reference, ids, mask, max_new_tokens: int = 20):
    """Greedy tokens equal to reference.generate, with the configs' eos and again with a stop
    token that row 0 really produces (its third new token: the row ends early and is padded)."""
    import lmforge

    free = reference.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False)
    assert torch.equal(lmforge.generate(model, ids, mask, max_new_tokens=max_new_tokens), free)
    stop = int(free[0, ids.shape[1] + 2])
    theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                eos_token_id=stop)
    ours = lmforge.generate(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=stop)
    assert torch.equal(ours, theirs)
    assert (theirs[0, ids.shape[1] + 3:] == reference.config.pad_token_id).all()  # row 0 stopped


# beam-search settings every generating family is checked with: the defaults, the canonical search
# with a length bonus, and early stopping with a short-favouring penalty plus logit processors
BEAM_VARIANTS = [{}, {"length_penalty": 2.0, "early_stopping": "never"},
                 {"length_penalty": -1.0, "early_stopping": True, "no_repeat_ngram_size": 2,
                  "min_new_tokens": 3}]


def assert_beam_parity(model, reference, ids, mask, max_new_tokens: int = 12, **options):
    """Beam search (num_beams=4) gives reference.generate's tokens: with the configs' eos, and again,
    returning the 2 best per input, with a stop token that row 0's best beam really produces (so
    hypotheses can finish at different lengths and be filled). Returns the first run."""
    import lmforge

    options = {"num_beams": 4, "max_new_tokens": max_new_tokens, **options}
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, do_sample=False, **options)
        free = lmforge.generate(model, ids, mask, **options)
        assert torch.equal(free, theirs)
        start = 1 if reference.config.is_encoder_decoder else ids.shape[1]
        stop = int(theirs[0, start + 3])
        theirs = reference.generate(ids, attention_mask=mask, do_sample=False, eos_token_id=stop,
                                    num_return_sequences=2, **options)
        ours = lmforge.generate(model, ids, mask, eos_token_id=stop, num_return_sequences=2, **options)
    assert ours.shape[0] == 2 * ids.shape[0] and torch.equal(ours, theirs)
    return free


def assert_causal_lm_parity(model, reference, ids, mask):
    """Last hidden states, logits and the shifted next-token loss (padding ignored) of a causal LM."""
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        ours = model(ids, mask)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.logits, theirs.logits, mask)
    loss = F.cross_entropy(ours.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def assert_export_state_dicts(model, reference, path):
    """Export: type(reference) reloads reference's exact tensors, lmforge.load model's; returns the reload."""
    import lmforge

    model.save(path, format="hf")
    back = type(reference).from_pretrained(path).eval()
    assert_same_state_dict(reference, back)
    assert_same_state_dict(model, lmforge.load(path))
    return back


def assert_export_round_trip(model, reference_class, path, ids, mask, reference=None):
    """model.save(format="hf"): the reference loads it with the same outputs (and, given the
    reference it was imported from, the same tensors); lmforge reloads the same state dict.
    Returns what the reference class loaded."""
    import lmforge

    model.save(path, format="hf")
    back = reference_class.from_pretrained(path).eval()
    with torch.no_grad():
        ours, theirs = model(ids, mask), back(ids, attention_mask=mask)
    assert_parity(ours.logits, theirs.logits, mask if ours.logits.dim() == 3 else None)
    if reference is not None:
        assert_same_state_dict(reference, back)
    assert_same_state_dict(model, lmforge.load(path))
    return back


def assert_reference_loads_export(model, reference_class, path, ids, mask, **compare):
    """Export: reference_class loads it with model's outputs (`compare` as in assert_forward_parity)."""
    model.save(path, format="hf")
    reference = reference_class.from_pretrained(path).eval()
    assert_forward_parity(model, reference, ids, mask, **compare)
    return reference  # for checks on what was loaded


def assert_untied_lm_head_round_trip(model, reference, path, ids, mask):
    """An imported untied MLM head gives the reference's logits, and so does the reload of its export."""
    assert_forward_parity(model, reference, ids, mask)
    model.save(path, format="hf")
    again = type(reference).from_pretrained(path).eval()
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask).logits
        assert_parity(again(ids, attention_mask=mask).logits, theirs, mask)


def assert_load_refuses(reference, path, error, match, load=None, **config_changes):
    """Saved with `config_changes` in its config.json, the reference fails to load (`load`) with `error`."""
    import lmforge

    save_reference(reference, path)
    if config_changes:
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, **config_changes}))
    with pytest.raises(error, match=match):
        (load or lmforge.load)(path)
