"""The sampling warpers against the reference library's: the same kept tokens and the same distribution."""
import pytest
import torch

import lmforge
from lmforge.generate import generate
from lmforge.generate.processors import penalise_repetition
from lmforge.generate.sampling import Sampling, argmax_rows, divide, filter_top_k, filter_top_p, next_tokens
from lmforge.heads import attach

from tests.parity.helpers import transformers

lp = transformers.generation.logits_process


def test_top_p_keeps_the_references_tokens_of_a_tie_at_the_boundary():
    """A tie straddling the nucleus' boundary: lmforge kept the lower ids (0, 1), the reference the higher."""
    scores = torch.zeros(1, 4)
    kept = filter_top_p(scores, 0.5) > float("-inf")
    assert kept.tolist() == [[False, False, True, True]]
    gen = torch.Generator().manual_seed(0)
    tied = torch.randn(64, 120, generator=gen).round()  # many ties at every boundary
    for p in (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95):
        assert torch.equal(filter_top_p(tied, p), lp.TopPLogitsWarper(p)(None, tied.clone()))


def test_a_temperature_below_one_gives_the_references_distribution_bit_for_bit():
    """Shifting the top score to 0 before dividing (done for every temperature < 1) moved probabilities by
    1e-5 here; the shift is kept for the quotients that overflow, where the reference gives NaN."""
    scores = torch.tensor([[-100.97, -97.83, -97.85, -101.28, -99.55, -99.68, -101.08, -101.18]])
    theirs = lp.TemperatureLogitsWarper(0.1)(None, scores.clone()).softmax(-1)
    assert torch.equal(divide(scores, 0.1).softmax(-1), theirs)
    gen = torch.Generator().manual_seed(0)
    assert next_tokens(scores, Sampling(do_sample=True, temperature=1e-300), gen).tolist() == [1]


def test_sampling_is_seeded_and_streams_every_step():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("gpt2")).eval()
    attach(model, "lm")
    ids = torch.randint(0, 99, (2, 3))
    seen = []
    runs = [generate(model, ids, max_new_tokens=8, do_sample=True, temperature=0.8, top_k=20, top_p=0.9,
                     generator=torch.Generator().manual_seed(7), streamer=seen.append) for _ in range(2)]
    assert torch.equal(runs[0], runs[1]) and len(seen) == 16
    assert torch.equal(torch.stack(seen[:8], 1), runs[0][:, 3:])


def test_filters_and_penalty_match_reference_processors():
    gen = torch.Generator().manual_seed(0)
    scores, seen = torch.randn(4, 50, generator=gen), torch.randint(0, 50, (4, 9), generator=gen)
    from transformers.generation import logits_process as lp

    torch.testing.assert_close(penalise_repetition(scores, seen, 1.3),
                               lp.RepetitionPenaltyLogitsProcessor(1.3)(seen, scores.clone()))
    torch.testing.assert_close(filter_top_k(scores, 5), lp.TopKLogitsWarper(5)(seen, scores.clone()))
    torch.testing.assert_close(filter_top_p(scores, 0.7), lp.TopPLogitsWarper(0.7)(seen, scores.clone()))
    assert int((filter_top_k(scores, 5) > float("-inf")).sum(-1).min()) == 5


def test_top_p_keeps_at_least_one_token_and_greedy_ignores_temperature():
    scores = torch.tensor([[10.0, 0.0, 0.0]])
    assert int((filter_top_p(scores, 0.01) > float("-inf")).sum()) == 1
    assert int(next_tokens(scores, Sampling(temperature=5.0))) == 0


def test_a_tiny_sampling_temperature_samples_the_top_token_instead_of_overflowing():
    """scores / 1e-300 overflow to inf (softmax NaN, multinomial raised): the limit is greedy."""
    scores = torch.tensor([[3.0, 2.0, -1.0, float("-inf")], [0.5, 4.0, 4.0 - 1e-3, 1.0]])
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        assert next_tokens(scores, Sampling(do_sample=True, temperature=1e-300), gen).tolist() == [0, 1]


@pytest.mark.parametrize("V", [5, 256, 300, 50257])
def test_blockwise_argmax_equals_argmax_with_ties_nan_and_a_maximum_in_the_tail(V):
    gen = torch.Generator().manual_seed(V)
    rows = [torch.randn(V, generator=gen) for _ in range(3)]
    rows.append(torch.full((V,), float("-inf")))
    tail = torch.randn(V, generator=gen)
    tail[-1] = 10.0  # only the overlapping last block holds the maximum
    tied = torch.randint(0, 3, (V,), generator=gen).float()  # many ties: the first one counts
    overlapped = torch.zeros(V)
    overlapped[V - 100 if V > 100 else 0] = 1.0  # inside both the last full block and the tail block
    overlapped[-1] = 1.0
    with_nan = torch.randn(V, generator=gen)
    with_nan[V // 2] = float("nan")
    scores = torch.stack(rows + [tail, tied, overlapped, with_nan])
    assert torch.equal(argmax_rows(scores), scores.argmax(-1))
    assert torch.equal(argmax_rows(scores[:, :-1]), scores[:, :-1].argmax(-1))  # not contiguous rows
