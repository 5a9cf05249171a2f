"""tasks/control.py: layer depths, freezing (frozen weights stay put and get no optimizer state) and
layer-wise learning-rate decay."""
import pytest
import torch

from lmforge.tasks import task_class
from lmforge.tasks.control import depth, freeze, lr_scale_fn, trainable_count
from lmforge.train import TrainConfig, Trainer
from tests.tasks.core import sentiment, tiny, tokenizer


def trainer(model, tmp_path, decay=1.0, **kw):
    base = dict(steps=4, batch_size=8, lr=3e-3, warmup=0, schedule="constant", log_every=1, progress=False)
    task = task_class("cls")(model, tokenizer(), labels=["0", "1"])
    examples = task.encode_all(sentiment()["train"][:32])
    return Trainer(task, examples, TrainConfig(**{**base, **kw}), tmp_path, log=lambda *a: None,
                   lr_scale=lr_scale_fn(model, decay))


def test_depths_of_an_encoder_and_an_encoder_decoder():
    bert, bart = tiny(), tiny("bart-base")
    assert [depth(bert, n) for n in ("tokens.weight", "embed.norm.weight", "encoder.blocks.0.ffn.up.weight",
                                     "encoder.blocks.1.ffn.up.weight", "heads.x.weight")] == [0, 0, 1, 2, 3]
    assert [depth(bart, n) for n in ("decoder_embed.norm.weight", "encoder.blocks.1.ffn.up.weight",
                                     "decoder.blocks.0.ffn.up.weight", "decoder.blocks.1.ffn.up.weight")] == \
        [0, 2, 3, 4]


@pytest.mark.parametrize("how, frozen_depths", [
    (dict(backbone=True), {0, 1, 2}),
    (dict(embeddings=True), {0}),
    (dict(layers=1), {1}),
    (dict(embeddings=True, layers=2), {0, 1, 2}),
])
def test_frozen_weights_do_not_change_and_get_no_optimizer_state(tmp_path, how, frozen_depths):
    model = tiny()
    t = trainer(model, tmp_path)  # the task head is attached now
    total = trainable_count(model)
    frozen_count = freeze(model, **how)
    assert trainable_count(model) == total - frozen_count  # what freeze stops training, counted
    t = trainer(model, tmp_path)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(2):
        t.train_step()
    with_state = {id(p) for p in t.optimizer.state}
    for name, param in model.named_parameters():
        frozen = depth(model, name) in frozen_depths and not name.startswith("heads.")
        assert torch.equal(param, before[name]) == frozen, name
        assert (id(param) in with_state) != frozen, name


def test_layer_wise_lr_decay_groups(tmp_path):
    model = tiny()
    t = trainer(model, tmp_path, decay=0.5, lr=1e-3)
    lr_of = {id(p): g["lr"] for g in t.optimizer.param_groups for p in g["params"]}
    expected = {0: 1e-3 * 0.5 ** 3, 1: 1e-3 * 0.5 ** 2, 2: 1e-3 * 0.5, 3: 1e-3}  # embeddings .. head
    for name, param in model.named_parameters():
        assert lr_of[id(param)] == pytest.approx(expected[depth(model, name)]), name
    t.train_step()  # the schedule keeps the ratios (LambdaLR scales each group's own lr)
    assert sorted({round(g["lr"] / 1e-3, 6) for g in t.optimizer.param_groups}) == [0.125, 0.25, 0.5, 1.0]
