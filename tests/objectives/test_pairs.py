import random

import pytest
import torch

import lmforge
from lmforge.data.examples import nsp_pairs, sop_pairs
from lmforge.objectives import PairMLM
from lmforge.train import Trainer

from tests.parity.helpers import transformers
from tests.train.helpers import quick


def _docs(n=60, seed=0):
    rng = random.Random(seed)
    # each document counts upward from its own start, so order and continuity are learnable
    out = []
    for _ in range(n):
        t = rng.randint(5, 60)
        doc = []
        for _ in range(rng.randint(2, 5)):
            length = rng.randint(2, 5)
            doc.append([5 + (t + k) % 94 for k in range(length)])
            t += length
        out.append(doc)
    return out


@pytest.mark.parametrize("task", ["nsp", "sop"])
def test_pair_pretraining_learns_and_exports_as_bert_for_pretraining(tmp_path, task):
    build = nsp_pairs if task == "nsp" else sop_pairs
    data = build(_docs(), cls=1, sep=2, max_len=24, seed=0)
    assert {e["pair_label"] for e in data} == {0, 1}
    torch.manual_seed(0)
    objective = PairMLM(lmforge.build(lmforge.tiny("bert-base")), mask_id=3, task=task, special_ids=(1, 2))
    batch = objective.collate([objective.corrupt(e, torch.Generator().manual_seed(i))
                               for i, e in enumerate(data[:4])])
    assert batch["pair_label"].shape == (4,) and batch["segment_ids"].shape == batch["input_ids"].shape
    model = Trainer(objective, data, quick(steps=20, lr=3e-3), tmp_path).fit()
    assert sorted(model.heads) == sorted(["lm", task])
    if task == "nsp":  # BertForPreTraining has an NSP head; the reference loads ours unchanged
        model.save(tmp_path / "hf", format="hf")
        reference = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
        ids = batch["input_ids"]
        with torch.no_grad():
            ours = model.eval()(ids, batch["attention_mask"], segment_ids=batch["segment_ids"])
            theirs = reference(ids, attention_mask=batch["attention_mask"],
                               token_type_ids=batch["segment_ids"])
        torch.testing.assert_close(ours.head_outputs["nsp"], theirs.seq_relationship_logits,
                                   atol=1e-5, rtol=1e-4)


def test_unknown_pair_task_is_refused():
    with pytest.raises(ValueError, match="task"):
        PairMLM(lmforge.build(lmforge.tiny("bert-base")), mask_id=3, task="order")
