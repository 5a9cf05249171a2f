import torch
import torch.nn.functional as F

import lmforge

from tests.parity.helpers import assert_parity, padded_batch, save_reference, transformers


def test_lm_hidden_states_logits_and_loss(tmp_path):
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0))
    model = lmforge.load(save_reference(reference, tmp_path))
    ids, mask = padded_batch(99)
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        theirs = reference(ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        ours = model(ids, mask)
    assert_parity(ours.last_hidden_state, theirs.hidden_states[-1], mask)
    assert_parity(ours.logits, theirs.logits, mask)
    loss = F.cross_entropy(ours.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
    torch.testing.assert_close(loss, theirs.loss, atol=1e-5, rtol=1e-4)


def test_export_round_trip(tmp_path):
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("gpt2")).eval()
    attach(model, "lm")
    model.save(tmp_path / "hf", format="hf")
    reference = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ids, mask = padded_batch(99, seed=2)
    with torch.no_grad():
        assert_parity(model(ids, mask).logits, reference(ids, attention_mask=mask).logits, mask)
    back = lmforge.load(tmp_path / "hf")
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())
