"""The sampling warpers against the reference library's: the same kept tokens and the same distribution."""
import torch

from lmforge.generate.sampling import filter_top_p

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
