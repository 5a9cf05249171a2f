import math
import re

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.heads import attach
from lmforge.objectives import IGNORE, Distillation, student_from_teacher
from lmforge.objectives.distilbert import DISTILBERT_LAYERS, cosine_loss, soft_cross_entropy
from lmforge.train import Trainer

from tests.train.helpers import quick, toy_data


def _teacher(n_layers=4, seed=0):
    torch.manual_seed(seed)
    teacher = lmforge.build(lmforge.tiny("bert-base"), n_layers=n_layers)
    attach(teacher, "lm")
    attach(teacher, "classification", n_labels=3)
    return teacher


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _batch(objective, n=6, seed=0):
    return objective.collate([objective.corrupt(e, torch.Generator().manual_seed(i))
                              for i, e in enumerate(toy_data(n, seed=seed))])


def test_student_block_k_is_teacher_block_2k_and_the_rest_is_copied():
    teacher = _teacher()
    student = student_from_teacher(teacher)
    assert student.config.n_layers == 2 and student.config.d_model == teacher.config.d_model
    for k in range(2):
        assert _same(student.encoder.blocks[k], teacher.encoder.blocks[2 * k])
        assert not _same(student.encoder.blocks[k], teacher.encoder.blocks[2 * k + 1])
    assert _same(student.embed, teacher.embed) and torch.equal(student.tokens.weight, teacher.tokens.weight)
    assert sorted(student.heads) == ["classification", "lm"]
    assert all(_same(student.heads[n], teacher.heads[n]) and student.heads[n].spec == teacher.heads[n].spec
               for n in teacher.heads)
    assert student.heads["lm"].tied is student.tokens  # tied to the student's own copy, not the teacher's
    assert student.tokens.weight.data_ptr() != teacher.tokens.weight.data_ptr()


def test_the_reference_script_choice_and_a_full_copy():
    teacher = _teacher(n_layers=12)
    student = student_from_teacher(teacher, DISTILBERT_LAYERS)  # 0, 2, 4, 7, 9, 11: first and last kept
    assert [k for k in range(6) if _same(student.encoder.blocks[k],
                                         teacher.encoder.blocks[DISTILBERT_LAYERS[k]])] == list(range(6))
    copy = student_from_teacher(teacher, range(12)).eval()
    objective = Distillation(copy, teacher, mask_id=3, special_ids=(1, 2)).eval()
    out = objective(_batch(objective))
    assert out.metrics["ce_loss"] < 1e-6 and out.metrics["cos_loss"] < 1e-6  # nothing left to distil
    with pytest.raises(ValueError, match="layers"):
        student_from_teacher(teacher, [12])


def test_soft_cross_entropy_and_cosine_loss_by_hand():
    student, teacher = torch.zeros(1, 2), torch.tensor([[math.log(3.0), 0.0]])
    # T = 1: teacher (3/4, 1/4) against the uniform student
    torch.testing.assert_close(soft_cross_entropy(student, teacher, 1.0),
                               torch.tensor(0.75 * math.log(1.5) + 0.25 * math.log(0.5)))
    # T = 2: teacher softmax(ln 3 / 2, 0) = (sqrt 3, 1) / (sqrt 3 + 1), times T^2 = 4
    p = math.sqrt(3) / (math.sqrt(3) + 1)
    expected = 4 * (p * math.log(2 * p) + (1 - p) * math.log(2 * (1 - p)))
    torch.testing.assert_close(soft_cross_entropy(student, teacher, 2.0), torch.tensor(expected))
    # two rows: cos 1/sqrt 2 and cos -1, so the mean of 1 - cos is (1 - 1/sqrt 2 + 2) / 2
    s, t = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[1.0, 1.0], [0.0, -1.0]])
    torch.testing.assert_close(cosine_loss(s, t), torch.tensor((3 - 1 / math.sqrt(2)) / 2))


@pytest.mark.parametrize("soft_on", ["real", "masked"])
def test_forward_is_alpha_ce_plus_beta_mlm_plus_gamma_cos(soft_on):
    teacher = _teacher()
    torch.manual_seed(1)
    student = lmforge.build(lmforge.tiny("bert-base"), n_layers=2)  # a stranger, so every term is large
    objective = Distillation(student, teacher, mask_id=3, special_ids=(1, 2), soft_on=soft_on).eval()
    batch = _batch(objective)
    out = objective(batch)
    real, labels = batch["attention_mask"].bool(), batch["labels"]
    with torch.no_grad():
        t = teacher(batch["input_ids"], batch["attention_mask"])
        s_hidden = student(batch["input_ids"], batch["attention_mask"]).last_hidden_state
        s_logits = objective.lm(s_hidden)  # every position, then pick by hand
    keep = real if soft_on == "real" else labels != IGNORE
    p_t = F.softmax(t.head_outputs["lm"][keep] / 2, -1)
    ce = 4 * (p_t * (p_t.log() - F.log_softmax(s_logits[keep] / 2, -1))).sum(-1).mean()
    mlm = F.cross_entropy(s_logits[labels != IGNORE], labels[labels != IGNORE])
    cos = 1 - (s_hidden[real] * t.last_hidden_state[real]).sum(-1) / (
        s_hidden[real].norm(dim=-1) * t.last_hidden_state[real].norm(dim=-1))
    torch.testing.assert_close(out.metrics["ce_loss"], ce)
    torch.testing.assert_close(out.metrics["mlm_loss"], mlm)
    torch.testing.assert_close(out.metrics["cos_loss"], cos.mean())
    torch.testing.assert_close(out.loss, 5 * ce + 2 * mlm + cos.mean())
    assert out.metrics["ce_loss"] > 0.01 and out.metrics["cos_loss"] > 0.5


def test_teacher_is_frozen_and_the_loss_falls(tmp_path):
    teacher = _teacher()
    teacher.reset_parameters(std=0.3)  # a confident teacher: at std 0.02 its predictions are nearly uniform
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student = student_from_teacher(teacher)
    objective = Distillation(student, teacher, mask_id=3, special_ids=(1, 2))
    modes = []
    teacher.register_forward_pre_hook(lambda m, args: modes.append((m.training, torch.is_grad_enabled())))
    fixed = _batch(objective, 8, seed=3)
    with torch.no_grad():
        start = objective.eval()(fixed)
    model = Trainer(objective, toy_data(96), quick(steps=30, lr=3e-3), tmp_path).fit()
    with torch.no_grad():
        end = objective.eval()(fixed)
    assert len(modes) > 30 and set(modes) == {(False, False)}  # eval mode, no graph, at every step
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    # measured: loss 32.6 -> 13.6, L_ce 4.01 -> 0.59, L_cos 1.17 -> 0.87, L_mlm 5.70 -> 4.88
    assert end.loss < start.loss - 4 and end.metrics["ce_loss"] < start.metrics["ce_loss"] / 2
    assert end.metrics["cos_loss"] < start.metrics["cos_loss"] - 0.1
    assert model is student and sorted(model.heads) == ["classification", "lm"]
    assert all(p.requires_grad for p in model.parameters())


def test_bad_settings_are_refused():
    teacher = _teacher()
    student = student_from_teacher(teacher)
    with pytest.raises(ValueError, match="soft_on"):
        Distillation(student, teacher, mask_id=3, soft_on="all")
    bare = lmforge.build(lmforge.tiny("bert-base"))
    with pytest.raises(ValueError, match="masked-LM head"):
        Distillation(student, bare, mask_id=3)
    with pytest.raises(ValueError, match="d_model"):
        Distillation(lmforge.build(lmforge.tiny("bert-base"), d_model=64), teacher, mask_id=3)
    with pytest.raises(ValueError, match="encoder"):
        Distillation(lmforge.build(lmforge.tiny("gpt2")), teacher, mask_id=3)
    # ALBERT's shared block has no layers to pick
    with pytest.raises(ValueError, match="one block per layer"):
        student_from_teacher(lmforge.build(lmforge.tiny("albert-base")))
    one = _teacher(1)  # every_other(1) is empty: refused saying why, not as an empty choice of layers
    with pytest.raises(ValueError, match="every other teacher layer needs a teacher of 2 layers or more"):
        student_from_teacher(one)
    assert student_from_teacher(one, (0,)).config.n_layers == 1


@pytest.mark.parametrize("option, value", [("temperature", float("nan")), ("temperature", 0.0),
                                           ("temperature", float("inf")), ("gamma", float("nan")),
                                           ("alpha", -1.0), ("beta", float("inf")), ("temperature", 1e-45),
                                           ("temperature", 1001.0), ("gamma", 1e30), ("beta", "2")])
def test_loss_options_that_are_not_finite_or_negative_are_named(option, value):
    teacher = _teacher(2)
    with pytest.raises(ValueError, match=f"^{re.escape(f'{option}={value!r}')}: must be a number >= "):
        Distillation(student_from_teacher(teacher), teacher, mask_id=3, **{option: value})
    with pytest.raises(ValueError, match="soft_on='every'"):
        Distillation(student_from_teacher(teacher), teacher, mask_id=3, soft_on="every")


def test_a_student_of_a_structurally_pruned_teacher_reindexes_its_layers_and_copies_them_exactly(tmp_path):
    from lmforge.compress.head_pruning import prune_heads
    from lmforge.compress.ffn import prune_ffn

    teacher = _teacher()
    prune_ffn(teacher, {f"encoder.{i}": torch.rand(64) for i in range(4)}, 0.25)
    prune_heads(teacher, {"encoder.1": [0], "encoder.3": [1, 2]})
    for layers in ((0, 2), (1, 3), (3,)):
        student = student_from_teacher(teacher, layers)
        cfg = student.config  # student layer k <- teacher layer layers[k]
        assert cfg.ffn_sizes == {f"encoder.{k}": teacher.config.ffn_sizes[f"encoder.{i}"]
                                 for k, i in enumerate(layers)}
        assert cfg.pruned_heads == ({f"encoder.{k}": teacher.config.pruned_heads[f"encoder.{i}"]
                                     for k, i in enumerate(layers) if i in (1, 3)} or None)
        assert all(_same(student.encoder.blocks[k], teacher.encoder.blocks[i]) for k, i in enumerate(layers))
        student.save(tmp_path / str(layers))
        assert _same(lmforge.load(tmp_path / str(layers)), student)  # it reloads as it was built


def test_a_resume_with_another_teacher_of_the_same_shape_is_refused(tmp_path):
    """The checkpoints carry the run's teacher: a resume with another one went on with the run's, unsaid."""
    teacher = _teacher()
    Trainer(Distillation(student_from_teacher(teacher), teacher, mask_id=3, special_ids=(1, 2)),
            toy_data(16), quick(steps=2), tmp_path).fit()
    other = _teacher(seed=1)  # the same shape, other weights
    again = Trainer(Distillation(student_from_teacher(other), other, mask_id=3, special_ids=(1, 2)),
                    toy_data(16), quick(steps=4), tmp_path)
    with pytest.raises(ValueError, match=r"teacher='[0-9a-f]{16}' \(the run's\)"):
        again.resume()
    same = Trainer(Distillation(student_from_teacher(teacher), teacher, mask_id=3, special_ids=(1, 2)),
                   toy_data(16), quick(steps=4), tmp_path)
    assert same.resume() and same.step == 2


def test_the_smallest_temperature_allowed_gives_a_finite_loss_and_a_smaller_one_is_refused():
    """T=1e-45 had been taken (finite, > 0) and gave a NaN loss: logits / T overflow fp32."""
    from lmforge.objectives.base import TEMPERATURE_RANGE

    low = TEMPERATURE_RANGE[0]
    student, teacher = torch.tensor([[300.0, -200.0, 0.0]]), torch.tensor([[-300.0, 100.0, 50.0]])
    assert math.isfinite(float(soft_cross_entropy(student, teacher, low)))
    teacher_model = _teacher(2)
    with pytest.raises(ValueError, match=f"^temperature={low / 2!r}: must be a number >= {low:g} and"):
        Distillation(student_from_teacher(teacher_model), teacher_model, mask_id=3, temperature=low / 2)


@pytest.mark.parametrize("soft_on", ["real", "masked"])
def test_a_batch_where_nothing_is_masked_contributes_nothing_not_nan(soft_on):
    """soft_on="masked" with no masked position (texts of special tokens only) had given a NaN loss."""
    teacher = _teacher(2)
    objective = Distillation(student_from_teacher(teacher), teacher, mask_id=3, soft_on=soft_on, gamma=0.0)
    ids = torch.randint(5, 50, (2, 6))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.full_like(ids, IGNORE)}
    out = objective(batch)
    assert math.isfinite(out.loss.item()) and float(out.metrics["mlm_loss"]) == 0.0
    assert (float(out.metrics["ce_loss"]) == 0.0) == (soft_on == "masked")
    out.loss.backward()  # still a graph: the trainer's backward step runs
    assert float(soft_cross_entropy(torch.zeros(0, 5), torch.zeros(0, 5), 2.0)) == 0.0

