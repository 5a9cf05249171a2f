import collections

import pytest
import torch

import lmforge
from lmforge.objectives import IGNORE, MaskedLM
from lmforge.objectives.mlm import budget, select_words, words

MASK, CLS, SEP = 3, 1, 2


def _objective(**kw):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base"))
    return MaskedLM(model, mask_id=MASK, special_ids=(CLS, SEP), **kw)


def _corpus(n=800, length=126, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [{"input_ids": [CLS, *torch.randint(5, 99, (length,), generator=gen).tolist(), SEP]}
            for _ in range(n)]


def test_selection_and_80_10_10_statistics_over_100k_tokens():
    objective = _objective()
    selected = masked = random = kept = candidates = 0
    for i, example in enumerate(_corpus()):
        out = objective.corrupt(example, torch.Generator().manual_seed(i))
        candidates += len(example["input_ids"]) - 2
        for orig, new, label in zip(example["input_ids"], out["input_ids"], out["labels"]):
            if label == IGNORE:
                assert new == orig
                continue
            assert label == orig and orig not in (CLS, SEP)
            selected += 1
            masked += new == MASK
            kept += new == orig
            random += new not in (MASK, orig)
    assert candidates >= 100_000
    assert abs(selected / candidates - 0.15) < 0.005
    # a random replacement can draw the original token (1 in 99): count it as random's share
    assert abs(masked / selected - 0.8) < 0.01
    assert abs((random + kept) / selected - 0.2) < 0.01 and abs(kept / selected - 0.1) < 0.012


def test_golden_example():
    objective = _objective()
    example = {"input_ids": [CLS, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, SEP]}
    out = objective.corrupt(example, torch.Generator().manual_seed(0))
    again = objective.corrupt(example, torch.Generator().manual_seed(0))
    assert out == again
    # 14 maskable tokens x 0.15 = 2.1 -> 2 selected here, both replaced by [MASK]
    assert out == {"input_ids": [1, 10, 11, 3, 3, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 2],
                   "labels": [-100] * 3 + [12, 13] + [-100] * 11}


def test_whole_word_masking_selects_whole_words_and_keeps_80_10_10():
    objective = _objective(whole_word=True)
    n_words = 100  # words of three pieces, ids 10..98
    ids = [CLS, *(10 + i % 89 for i in range(3 * n_words)), SEP]
    starts = [True] + [i % 3 == 0 for i in range(3 * n_words)] + [True]
    selected = masked = random = kept = 0
    for seed in range(600):
        out = objective.corrupt({"input_ids": ids, "word_starts": starts},
                                torch.Generator().manual_seed(seed))
        chosen = {i for i, label in enumerate(out["labels"]) if label != IGNORE}
        for w in range(n_words):  # each word is selected whole or not at all
            piece = {1 + 3 * w, 2 + 3 * w, 3 + 3 * w}
            assert piece <= chosen or not piece & chosen
        assert abs(len(chosen) - 0.15 * 3 * n_words) <= 3  # whole words: the budget within one word
        for i in chosen:  # BERT's reference code draws 80/10/10 per piece of a selected word
            new = out["input_ids"][i]
            assert out["labels"][i] == ids[i]
            masked += new == MASK
            kept += new == ids[i]
            random += new not in (MASK, ids[i])
        selected += len(chosen)
        assert "word_starts" not in out
    assert selected > 25_000  # 4 standard deviations of each share below fit the tolerances
    # a random draw lands on [MASK] or the piece itself 2 times in 99: within the tolerances
    assert abs(masked / selected - 0.8) < 0.01
    assert abs(random / selected - 0.1) < 0.008 and abs(kept / selected - 0.1) < 0.008
    assert masked + random + kept == selected


def test_budget_is_exact_in_expectation_and_words_fit_it():
    gen = torch.Generator().manual_seed(0)
    assert abs(sum(budget(10, 0.15, gen) for _ in range(4000)) / 4000 - 1.5) < 0.05
    groups = words({"word_starts": [True, False, True, True, False, False]}, list(range(6)))
    assert groups == [[0, 1], [2], [3, 4, 5]]
    assert len(select_words(groups, 2, torch.Generator().manual_seed(1))) <= 2


def test_loss_projects_only_selected_positions_and_matches_full_projection():
    objective = _objective()
    batch = objective.collate([objective.corrupt(e, torch.Generator().manual_seed(i))
                               for i, e in enumerate(_corpus(4, 20))])
    calls = []
    objective.lm.register_forward_hook(lambda m, args, out: calls.append(out.shape))
    objective.eval()
    loss = objective(batch).loss
    assert calls[0][0] == int((batch["labels"] != IGNORE).sum())
    with torch.no_grad():
        hidden = objective.model(batch["input_ids"], batch["attention_mask"]).last_hidden_state
        full = torch.nn.functional.cross_entropy(objective.lm(hidden).flatten(0, 1),
                                                 batch["labels"].flatten())
    torch.testing.assert_close(loss, full)


def test_bad_rates_are_refused():
    with pytest.raises(ValueError, match="rate"):
        _objective(rate=0.0)
    with pytest.raises(ValueError, match="summing to 1"):
        _objective(replace=(0.8, 0.1, 0.2))


def test_random_replacements_are_real_words_drawn_uniformly():
    objective = _objective(replace=(0.0, 1.0, 0.0))  # every selected token replaced at random
    seen = collections.Counter()
    for i, example in enumerate(_corpus(200, 126)):
        out = objective.corrupt(example, torch.Generator().manual_seed(i))
        seen.update(t for t, label in zip(out["input_ids"], out["labels"]) if label != IGNORE)
    # never [CLS], [SEP], [PAD] (0) or [MASK]: a random replacement puts a word where a word was
    assert set(seen) == set(range(99)) - {0, CLS, SEP, MASK}
    expected = sum(seen.values()) / len(seen)  # ~40 each over 95 ids
    assert all(abs(n - expected) < 5 * expected ** 0.5 for n in seen.values())


def seed_outcomes(corrupt, example, n=20) -> list:
    """corrupt(example, generator) for seeds 0..n-1, each checked to depend on its seed alone: the same
    seed again, after the global RNG has moved, gives the same result."""
    outcomes = []
    for seed in range(n):
        torch.manual_seed(1000 + seed)
        out = corrupt(example, torch.Generator().manual_seed(seed))
        torch.manual_seed(2000 + seed)
        assert corrupt(example, torch.Generator().manual_seed(seed)) == out
        outcomes.append(repr(out))
    return outcomes


@pytest.mark.parametrize("whole_word", [False, True])
def test_a_seed_fixes_every_draw_and_different_seeds_draw_different_masks(whole_word):
    objective = _objective(whole_word=whole_word)
    example = {**_corpus(1, 60)[0], "word_starts": [True] + [i % 2 == 0 for i in range(60)] + [True]}
    assert len(set(seed_outcomes(objective.corrupt, example))) == 20


def test_a_vocabulary_of_special_tokens_alone_is_refused_before_any_draw():
    from lmforge.objectives.mlm import real_tokens

    assert real_tokens(5, {0, 1, 2}).tolist() == [3, 4]
    with pytest.raises(ValueError, match="vocab_size=3: every id is a special token"):
        real_tokens(3, {0, 1, 2})
