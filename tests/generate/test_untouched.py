"""generate leaves the model exactly as it found it: weights, storage, strides, classes, attributes, modes."""
import pytest
import torch

import lmforge
from lmforge.heads import attach
from tests.fast.test_optimize import _same, _snapshot


@pytest.mark.parametrize("projection", ["auto", "plain", "input-major", "screen"])
@pytest.mark.parametrize("name", ["gpt2", "t5-small"])
def test_generate_changes_nothing_in_the_model(name, projection):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(name).replace(vocab_size=300))
    attach(model, "lm")
    model.eval()
    model.heads.train()  # a mix of modes, which a blanket model.train() would not restore
    before = _snapshot(model)
    ids = torch.randint(3, 300, (2, 6), generator=torch.Generator().manual_seed(0))
    extra = {"decoder_start_token_id": 0} if name == "t5-small" else {}
    for _ in range(3):  # auto builds its copies from the second call on
        lmforge.generate(model, ids, max_new_tokens=9, projection=projection, **extra)
    lmforge.generate(model, ids, max_new_tokens=9, num_beams=2, projection=projection, **extra)
    assert _same(_snapshot(model), before)


def test_every_projection_gives_the_same_tokens():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("gpt2").replace(vocab_size=500))
    attach(model, "lm")
    ids = torch.randint(3, 500, (3, 6), generator=torch.Generator().manual_seed(0))
    outs = [lmforge.generate(model, ids, max_new_tokens=10, projection=p)
            for p in ("plain", "input-major", "screen", "auto", "auto")]
    assert all(torch.equal(out, outs[0]) for out in outs)
