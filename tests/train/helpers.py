"""A tiny training setup shared by the training-loop tests."""
import pytest
import torch

import lmforge
from lmforge.objectives import CausalLM, MaskedLM
from lmforge.train import TrainConfig


def toy_data(n=48, seed=0, vocab=99):
    """Variable-length [CLS] ... [SEP] examples of counting runs over ids 5..vocab-1 (learnable)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length, start = (int(torch.randint(4, 14, (), generator=gen)),
                         int(torch.randint(0, vocab, (), generator=gen)))
        out.append({"input_ids": [1, *(5 + (start + i) % (vocab - 5) for i in range(length)), 2]})
    return out


def mlm_objective(seed=0, **overrides):
    """A tiny BERT under masked LM."""
    torch.manual_seed(seed)
    model = lmforge.build(lmforge.tiny("bert-base"), **overrides)
    return MaskedLM(model, mask_id=3, special_ids=(1, 2))


def clm_objective(seed=0, **overrides):
    """A tiny GPT-2 under causal LM."""
    torch.manual_seed(seed)
    return CausalLM(lmforge.build(lmforge.tiny("gpt2"), **overrides))


def quick(**kw):
    """A short run's training config."""
    base = dict(steps=6, batch_size=4, lr=1e-3, warmup=2, log_every=1, progress=False)
    return TrainConfig(**{**base, **kw})


def interrupt_after(trainer, steps: int) -> None:
    """Run trainer.fit() as if killed (KeyboardInterrupt) once `steps` steps are done."""
    step = trainer.train_step

    def stop():
        if trainer.step == steps:
            raise KeyboardInterrupt
        return step()

    trainer.train_step = stop
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
