"""The logits processors (min lengths, n-gram bans, repetition penalty, forced and suppressed tokens)
against the reference library's, in float32 whatever the model's dtype, as the reference runs them."""
import torch

import lmforge
from lmforge.generate import generate
from lmforge.generate.processors import Constraints, ban_repeated_ngrams
from lmforge.heads import attach

from tests.parity.helpers import transformers  # noqa: F401 (the file is skipped without it)


def test_processors_match_the_reference():
    from transformers.generation import logits_process as lp

    gen = torch.Generator().manual_seed(0)
    scores, seen = torch.randn(4, 20, generator=gen), torch.randint(0, 6, (4, 9), generator=gen)
    for n in (1, 2, 3):
        torch.testing.assert_close(ban_repeated_ngrams(scores, seen, n),
                                   lp.NoRepeatNGramLogitsProcessor(n)(seen, scores.clone()))
    padding = torch.tensor([0, 2, 5, 9])
    ours = Constraints(9, 30, repetition_penalty=1.5, padding=padding)(scores, seen)
    theirs = lp.RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=padding)(seen, scores.clone())
    torch.testing.assert_close(ours, theirs)
    eos = torch.tensor([3, 5])
    cases = [(Constraints(9, 30, eos, min_length=10), lp.MinLengthLogitsProcessor(10, [3, 5])),
             (Constraints(7, 30, eos, min_new_tokens=3), lp.MinNewTokensLengthLogitsProcessor(7, 3, [3, 5])),
             (Constraints(7, 30, eos, min_new_tokens=2), lp.MinNewTokensLengthLogitsProcessor(7, 2, [3, 5])),
             (Constraints(1, 30, forced_bos_token_id=4), lp.ForcedBOSTokenLogitsProcessor(4)),
             (Constraints(1, 10, forced_eos_token_id=4), lp.ForcedEOSTokenLogitsProcessor(10, 4)),
             (Constraints(1, 30, suppress_tokens=eos), lp.SuppressTokensLogitsProcessor([3, 5]))]
    for ours, theirs in cases:
        for T in (1, 9):
            torch.testing.assert_close(ours(scores, seen[:, :T]), theirs(seen[:, :T], scores.clone()))


def test_a_half_precision_models_scores_are_processed_in_float32_as_the_reference_does(monkeypatch):
    """The reference casts each step's logits to float32 before its processors; penalised in bfloat16 they
    were rounded to it (sampling probabilities moved by up to 0.01)."""
    from transformers.generation import logits_process as lp

    calls, process = [], Constraints.__call__

    def recorded(self, scores, seen):
        calls.append((scores, seen, process(self, scores, seen)))
        return calls[-1][2]

    monkeypatch.setattr(Constraints, "__call__", recorded)
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("gpt2")).eval()
    attach(model, "lm")
    generate(model.to(torch.bfloat16), torch.tensor([[5, 6, 7, 5]]), max_new_tokens=3, do_sample=True,
             repetition_penalty=1.3, generator=torch.Generator().manual_seed(0))
    for scores, seen, ours in calls:
        assert scores.dtype == torch.float32
        assert torch.equal(ours, lp.RepetitionPenaltyLogitsProcessor(1.3)(seen, scores.clone()))
