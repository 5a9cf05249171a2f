"""The sampling warpers against the reference library's: the same kept tokens and the same distribution."""
import torch

from lmforge.generate.sampling import Sampling, divide, filter_top_p, next_tokens

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
