import torch
import torch.nn.functional as F

import lmforge
from lmforge.objectives import IGNORE
from lmforge.objectives.clm import CausalLM

PAD = 0


def _objective():
    torch.manual_seed(0)
    return CausalLM(lmforge.build(lmforge.tiny("gpt2")), pad_id=PAD)


def test_each_position_predicts_the_next_real_token_and_padding_carries_no_loss():
    objective = _objective().eval()
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(5, 99, (n,), generator=gen).tolist() for n in (12, 7, 9)]
    batch = objective.collate([{"input_ids": r} for r in rows])
    with torch.no_grad():
        loss = objective(batch).loss
        logits = objective.lm(objective.model(batch["input_ids"], batch["attention_mask"]).last_hidden_state)
    # the reference shift (GPT, transformers' labels = input_ids): logits[t] scores token t + 1
    target = batch["input_ids"][:, 1:].masked_fill(batch["attention_mask"][:, 1:] == 0, IGNORE)
    expected = F.cross_entropy(logits[:, :-1].flatten(0, 1), target.flatten(), ignore_index=IGNORE)
    torch.testing.assert_close(loss, expected)
    assert int((target != IGNORE).sum()) == sum(len(r) - 1 for r in rows)  # 11 + 6 + 8 predictions


def test_the_loss_at_a_position_does_not_read_later_tokens():
    objective = _objective().eval()
    ids = torch.arange(10, 30)[None]
    changed = ids.clone()
    changed[0, -1] = 50  # the last token is a target only: the predictions before it see no more
    with torch.no_grad():
        hidden = [objective.model(x, torch.ones_like(x)).last_hidden_state for x in (ids, changed)]
    torch.testing.assert_close(hidden[0][:, :-1], hidden[1][:, :-1])
