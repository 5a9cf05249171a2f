import json

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.objectives import IGNORE, ReplacedTokenDetection
from lmforge.objectives.rtd import generator_config, replace_tokens
from lmforge.train import Trainer

from tests.parity.helpers import transformers
from tests.train.helpers import interrupt_after, quick, toy_data

MASK, CLS, SEP = 3, 1, 2


def _objective(preset="electra-base", **kw):
    torch.manual_seed(0)
    return ReplacedTokenDetection(lmforge.build(lmforge.tiny(preset)), mask_id=MASK,
                                  special_ids=(CLS, SEP), **kw)


@pytest.mark.parametrize("preset, ratio", [("electra-base", 1 / 3), ("electra-large", 1 / 4)])
def test_generator_config_matches_the_released_generators(preset, ratio):
    # Table 6's multipliers of hidden size, FFN size and heads give the released generators' shapes
    ours, released = (generator_config(lmforge.get_config(preset), ratio),
                      lmforge.get_config(f"{preset}-generator"))
    for field in ("d_model", "d_ff", "n_heads", "n_layers", "embed_dim", "vocab_size"):
        assert getattr(ours, field) == getattr(released, field), field


# the released generators (google/electra-*-generator): hidden 256 for every size, so 1 for small (the
# released ELECTRA-Small++; the paper's Table 6 small model used 1/4), 1/3 for base, 1/4 for large
RELEASED = {"electra-small": 1.0, "electra-base": 1 / 3, "electra-large": 1 / 4}


@pytest.mark.parametrize("preset", list(RELEASED))
def test_each_electra_preset_builds_its_released_generator(preset):
    cfg = lmforge.get_config(preset)
    assert cfg.generator_size == pytest.approx(RELEASED[preset])
    ours, released = generator_config(cfg), lmforge.get_config(f"{preset}-generator")
    for field in ("d_model", "d_ff", "n_heads", "n_layers", "embed_dim", "vocab_size"):
        assert getattr(ours, field) == getattr(released, field), field


def test_the_objective_reads_the_generator_size_from_the_config():
    base = lmforge.tiny("electra-base")
    for size, width in ((None, 8), (0.5, 16), (1.0, 32)):  # None: the official default, 1/4
        torch.manual_seed(0)
        objective = ReplacedTokenDetection(lmforge.build(base, generator_size=size), mask_id=MASK)
        assert objective.generator.model.config.d_model == width
    torch.manual_seed(0)
    given = ReplacedTokenDetection(lmforge.build(base, generator_size=0.5), mask_id=MASK, ratio=0.25)
    assert given.generator.model.config.d_model == 8  # an explicit ratio wins


@pytest.mark.parametrize("bad", [0, 1.5, -0.25, True, "half"])
def test_a_generator_size_must_be_a_fraction(bad):
    with pytest.raises(lmforge.ConfigError, match="generator_size"):
        lmforge.get_config("electra-base", generator_size=bad)


@pytest.mark.parametrize("bad", [0, 1.5, float("nan"), True, "half", [0.5]])
def test_a_generator_ratio_must_be_a_fraction(bad):
    """A bake-off arm's options: {ratio: half} was a TypeError traceback comparing it with 0."""
    with pytest.raises(ValueError, match=r"^ratio=.*: must be a number > 0 and <= 1$"):
        generator_config(lmforge.get_config("electra-base"), bad)


def test_the_generator_size_is_no_part_of_the_architecture():
    cfg = lmforge.get_config("electra-base")
    assert cfg.replace(generator_size=0.5).canonical() == cfg.replace(generator_size=None).canonical()


@pytest.mark.parametrize("preset", ["electra-base", "electra-small"])
def test_generator_shares_the_embeddings_and_is_a_quarter_as_wide(preset):
    objective = _objective(preset, ratio=0.25)
    D, G = objective.model, objective.generator.model
    assert (G.config.d_model, G.config.n_heads, G.config.d_ff, G.config.n_layers) == (8, 1, 16, 2)
    assert G.tokens.weight is D.tokens.weight  # one token table, one tensor
    for name in ("segments", "positions", "norm"):
        assert getattr(G.embed, name) is getattr(D.embed, name)
    assert objective.shared == ["tokens", "embed.segments", "embed.positions", "embed.norm"]
    assert G.embed.project is not None and G.embed.project is not D.embed.project  # E -> 8 and E -> 32
    assert objective.generator.lm.tied is D.tokens  # the generator's output layer is the shared table too
    params = {id(p) for p in objective.parameters()}
    assert len(params) == sum(1 for _ in objective.parameters())  # the shared table is counted once


def test_an_xlnet_discriminator_gets_a_generator_head_that_reaches_the_shared_table():
    """XLNet's LM head has no transform: the 8-wide generator's read its hidden states straight into the
    32-wide tied table, a shape error at the first step; it gets ELECTRA's d_model -> E transform instead."""
    assert not lmforge.tiny("xlnet-base").lm_transform
    assert generator_config(lmforge.tiny("xlnet-base")).lm_transform
    assert generator_config(lmforge.tiny("xlnet-base"), 1.0).lm_transform is False  # as wide as E: as it is
    objective = _objective("xlnet-base", ratio=0.25)
    head = objective.generator.lm
    assert head.tied is objective.model.tokens and head.transform.out_features == 32
    batch = objective.collate([objective.corrupt(e, torch.Generator().manual_seed(i))
                               for i, e in enumerate(toy_data(4))])
    out = objective(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and head.transform.weight.grad.abs().sum() > 0


def _corpus(n=800, length=126, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [{"input_ids": [CLS, *torch.randint(5, 99, (length,), generator=gen).tolist(), SEP]}
            for _ in range(n)]


def test_masking_statistics_over_100k_tokens_follow_the_official_85_0_15():
    objective = _objective()
    selected = masked = kept = candidates = 0
    for i, example in enumerate(_corpus()):
        out = objective.corrupt(example, torch.Generator().manual_seed(i))
        candidates += len(example["input_ids"]) - 2
        for orig, new, label in zip(example["input_ids"], out["input_ids"], out["labels"]):
            if label == IGNORE:
                assert new == orig
                continue
            assert label == orig and orig not in (CLS, SEP) and new in (MASK, orig)  # never a random token
            selected += 1
            masked += new == MASK
            kept += new == orig
    assert candidates >= 100_000
    assert abs(selected / candidates - 0.15) < 0.005
    assert abs(masked / selected - 0.85) < 0.01 and masked + kept == selected


def test_golden_example():
    objective = _objective()
    example = {"input_ids": [CLS, *range(10, 30), SEP]}
    out = objective.corrupt(example, torch.Generator().manual_seed(0))
    assert out == objective.corrupt(example, torch.Generator().manual_seed(0))
    # 20 maskable x 0.15 = 3 selected: 11 and 29 become [MASK], 18 is selected but left as it is
    ids = [CLS, *range(10, 30), SEP]
    ids[2], ids[20] = MASK, MASK
    labels = [IGNORE] * 22
    labels[2], labels[9], labels[20] = 11, 18, 29
    assert out == {"input_ids": ids, "labels": labels}


def test_labels_are_one_exactly_where_the_sampled_token_differs():
    ids = torch.tensor([[1, 3, 11, 3, 13, 2], [1, 20, 3, 2, 0, 0]])
    labels = torch.tensor([[IGNORE, 10, IGNORE, 12, 13, IGNORE],
                           [IGNORE, IGNORE, 21, IGNORE, IGNORE, IGNORE]])
    # one sample per selected position in reading order: the original back (10), a replacement (50),
    # a replacement of a token that was kept unmasked (60), the original back (21)
    corrupted, replaced = replace_tokens(ids, labels, torch.tensor([10, 50, 60, 21]))
    assert corrupted.tolist() == [[1, 10, 11, 50, 60, 2], [1, 20, 21, 2, 0, 0]]
    assert replaced.tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize("seed", range(6))
def test_discriminator_sees_the_samples_and_its_loss_covers_every_real_position(seed):
    objective = _objective().eval()
    batch = objective.collate([objective.corrupt(e, torch.Generator().manual_seed(100 * seed + i))
                               for i, e in enumerate(toy_data(6, seed=seed))])
    seen = []
    objective.model.register_forward_hook(lambda m, args, out: seen.append((args[0], out.last_hidden_state)))
    torch.manual_seed(seed)
    out = objective(batch)
    corrupted, hidden = seen[0]
    selected, real = batch["labels"] != IGNORE, batch["attention_mask"].bool()
    original = torch.where(selected, batch["labels"], batch["input_ids"])
    assert torch.equal(corrupted[~selected], original[~selected])  # only the selected positions change
    assert MASK not in corrupted[real].tolist()  # the discriminator never sees [MASK]
    replaced = (corrupted != original)[real].float()
    assert out.metrics["replaced"] == replaced.mean() and replaced.sum() > 0
    with torch.no_grad():
        bce = F.binary_cross_entropy_with_logits(objective.rtd(hidden)[real], replaced)
    torch.testing.assert_close(out.metrics["disc_loss"], bce)
    torch.testing.assert_close(out.loss, out.metrics["mlm_loss"] + 50 * bce)


def test_a_generator_that_prefers_mask_still_never_shows_it_to_the_discriminator():
    objective = _objective().eval()
    with torch.no_grad():  # the generator's favourite token is now [MASK], by a wide margin
        objective.generator.lm.bias[MASK] += 30.0
    for seed in range(8):
        batch = objective.collate([objective.corrupt(e, torch.Generator().manual_seed(100 * seed + i))
                                   for i, e in enumerate(toy_data(8, seed=seed))])
        seen: list = []
        hook = objective.model.register_forward_hook(lambda m, args, out, seen=seen: seen.append(args[0]))
        torch.manual_seed(seed)
        objective(batch)
        hook.remove()
        real, selected = batch["attention_mask"].bool(), batch["labels"] != IGNORE
        assert selected.any() and MASK not in seen[0][real].tolist()


def test_loss_falls_and_the_discriminator_exports_as_electra_for_pretraining(tmp_path):
    objective = _objective()
    model = Trainer(objective, toy_data(96), quick(steps=30, lr=3e-3), tmp_path).fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first, last = records[0], records[-1]
    assert last["loss"] < first["loss"] - 10 and last["disc_loss"] < first["disc_loss"] - 0.2
    assert model is objective.model and sorted(model.heads) == ["rtd"]
    assert objective.generator.model.tokens.weight is model.tokens.weight  # still one table after training
    model.save(tmp_path / "hf", format="hf")
    reference = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "hf").eval()
    batch = objective.collate([objective.corrupt(e, torch.Generator().manual_seed(i))
                               for i, e in enumerate(toy_data(3, seed=1))])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        ours, theirs = model.eval()(ids, mask).logits, reference(ids, attention_mask=mask).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    generator = objective.finish_generator().eval()  # the generator exports as ElectraForMaskedLM
    generator.save(tmp_path / "gen", format="hf")
    reference = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "gen").eval()
    with torch.no_grad():
        torch.testing.assert_close(generator(ids, mask).logits, reference(ids, attention_mask=mask).logits,
                                   atol=1e-5, rtol=1e-4)


def test_resume_continues_exactly_with_the_shared_table(tmp_path):
    full = Trainer(_objective(), toy_data(), quick(steps=4), tmp_path / "a").fit()
    interrupt_after(Trainer(_objective(), toy_data(), quick(steps=4, save_every=1), tmp_path / "b"), 2)
    objective = _objective()
    resumed = Trainer(objective, toy_data(), quick(steps=4, save_every=1), tmp_path / "b").fit(resume=True)
    assert objective.generator.model.tokens.weight is resumed.tokens.weight
    a, b = full.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # generator samples included


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="ratio"):
        _objective(ratio=0.0)
    with pytest.raises(ValueError, match="encoder"):
        ReplacedTokenDetection(lmforge.build(lmforge.tiny("gpt2")), mask_id=MASK)
