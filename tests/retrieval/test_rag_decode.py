"""RAG decoding with beams (sec. 2.5) on a tiny BART over a five-token vocabulary and three fixed passages,
against hand computations in float64 from full forward passes: one beam is the greedy decoding, RAG-Token's
wide beam is the exhaustive search, RAG-Sequence scores are sum_z p(z | x) p(y | x, z), Fast Decoding runs
no pass of its own and equals Thorough Decoding where every hypothesis is in every beam; over fixed random
next-token tables, RAG-Token's search is the exhaustive one when wide and never worse than greedy."""
from __future__ import annotations

import itertools
import math
import zlib
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import lmforge
from lmforge.generate.beam import Beams, beam_search
from lmforge.generate.options import MAX_BEAMS, GenerationOptions
from lmforge.retrieval.rag_decode import FILL, MarginalSteps, check_decoding, passage_beams
from lmforge.retrieval.rag_train import RAGObjective
from lmforge.utils.errors import OptionsError

V, PAD, CLS, SEP = 5, 0, 1, 2
DOC = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]]))  # p(z | x) of two questions' passages
ROWS = torch.tensor([[0, 1, 2], [2, 0, 1]])
BATCH = {"source": torch.tensor([[3, 4], [4, 0]]), "source_len": torch.tensor([2, 1])}


class _Tokenizer:
    """The generator's five tokens: pad, [CLS], [SEP] and two words."""

    vocab_size = V

    def special_id(self, name):
        return {"pad": PAD, "cls": CLS, "sep": SEP}.get(name)


def _objective(kind: str, seed: int = 0) -> RAGObjective:
    """A tiny BART whose passages lead it to different answers (its encoder and cross-attention pushed
    far from their start), with flat next-token distributions (logit scale 0.3, where greedy and beams
    part); retrieval fixed to DOC and ROWS."""
    torch.manual_seed(seed)
    generator = lmforge.build(lmforge.tiny("bart-base"), vocab_size=V, max_seq_len=32,
                              decoder_start_token_id=CLS, pad_token_id=PAD)
    for name, p in generator.named_parameters():
        p.data.add_((3.0 if "encoder" in name or "cross" in name else 0.3) * torch.randn_like(p))
    retriever = SimpleNamespace(tokenizer=_Tokenizer(), model=nn.Linear(1, 1))
    objective = RAGObjective(generator, retriever, torch.zeros(3, 1), [[3, 4, 3], [4, 4], [3, 0, 4, 3]], k=3,
                             kind=kind).eval()
    objective.lm.logit_scale = 0.3
    objective.retrieve = lambda batch: (DOC, ROWS)
    return objective


class _Hand:
    """p(y | x, z) per token from full forward passes (no cache), in float64."""

    def __init__(self, objective) -> None:
        self.o = objective
        self.ids, self.mask = objective.generator_inputs(BATCH, ROWS)

    def probs(self, b: int, z: int, y: list) -> torch.Tensor:
        """(len(y), V) p(. | x, z, y_<i) of question b's passage z."""
        i = b * 3 + z
        n = int(self.mask[i].sum())
        with torch.no_grad():
            hidden = self.o.model(self.ids[i:i + 1, :n], self.mask[i:i + 1, :n],
                                  decoder_input_ids=torch.tensor([[CLS, *y[:-1]]]), run_heads=False)
            return torch.softmax(self.o.lm(hidden.last_hidden_state)[0].double(), -1)

    def per_passage(self, b: int, y: list) -> list:
        """[p(y_i | x, z, y_<i) for each i] for each passage z."""
        return [self.probs(b, z, y)[range(len(y)), y] for z in range(3)]

    def token(self, b: int, y: list) -> float:
        """log prod_i sum_z p(z | x) p(y_i | x, z, y_<i)."""
        p = torch.stack(self.per_passage(b, y))  # (K, len(y))
        return float((DOC[b].double().exp()[:, None] * p).sum(0).log().sum())

    def sequence(self, b: int, y: list, passages=range(3)) -> float:
        """log sum_z p(z | x) prod_i p(y_i | x, z, y_<i), over `passages`."""
        each = self.per_passage(b, y)
        return math.log(sum(float(DOC[b, z].exp()) * float(each[z].prod()) for z in passages))


def _hypotheses(length: int) -> list:
    """Every answer of at most `length` tokens: ended by [SEP] (kept), or `length` tokens without it."""
    words = [t for t in range(V) if t != SEP]
    ended = [[*w, SEP] for n in range(length) for w in itertools.product(words, repeat=n)]
    return ended + [list(w) for w in itertools.product(words, repeat=length)]


def _ended(answer: list, length: int) -> list:
    """An answer with its [SEP] back (an answer shorter than the budget stopped there)."""
    return answer + [SEP] if len(answer) < length else answer


def test_one_beam_is_the_greedy_decoding_of_each_kind():
    token, sequence = _objective("token"), _objective("sequence", seed=1)
    hand = _Hand(token)
    for b in range(2):  # RAG-Token: the marginal's greedy tokens, cut at [SEP]
        y = []
        for _ in range(3):
            p = sum(float(DOC[b, z].exp()) * hand.probs(b, z, [*y, 0])[-1] for z in range(3))
            y.append(int(p.argmax()))
        assert token.answer(BATCH, 3, num_beams=1)[b] == (y[:y.index(SEP)] if SEP in y else y)
    assert token.answer(BATCH, 3) == token.answer(BATCH, 3, num_beams=1)
    # RAG-Sequence: each passage's greedy answer, passage by passage, the best under p(y | x) answering
    hand, answers = _Hand(sequence), sequence.answer(BATCH, 3, num_beams=1)
    for b, (candidates, scores) in enumerate(sequence.sequence_candidates(BATCH, DOC, ROWS, 3)):
        drawn = []
        for z in range(3):
            y = []
            while len(y) < 3 and SEP not in y:
                y.append(int(hand.probs(b, z, [*y, 0])[-1].argmax()))
            drawn += [y] if y not in drawn else []
        assert candidates == drawn
        want = [hand.sequence(b, y) for y in drawn]
        assert scores.tolist() == pytest.approx(want, abs=1e-5)
        assert _ended(answers[b], 3) == drawn[want.index(max(want))]
    assert max(len(c) for c, _ in sequence.sequence_candidates(BATCH, DOC, ROWS, 3)) > 1  # passages differ


def test_a_wide_rag_token_beam_is_the_exhaustive_search_and_beams_never_lose_to_greedy():
    objective = _objective("token")
    hand = _Hand(objective)
    # 20 = (V - 1) * V: every candidate of every step before the last is kept, so the search is exact
    wide = objective.answer(BATCH, 3, num_beams=20)
    assert wide != objective.answer(BATCH, 3)  # the search finds what greedy decoding does not
    for b in range(2):
        scores = {tuple(y): hand.token(b, y) for y in _hypotheses(3)}
        best = max(scores, key=scores.get)
        assert _ended(wide[b], 3) == list(best)
        greedy = scores[tuple(_ended(objective.answer(BATCH, 3)[b], 3))]
        for n in (2, 4):  # narrower beams find no worse than greedy on these models
            assert scores[tuple(_ended(objective.answer(BATCH, 3, num_beams=n)[b], 3))] >= greedy - 1e-9
        assert greedy <= scores[best]


def test_rag_sequence_scores_are_the_hand_marginals_thorough_over_all_passages_fast_over_each_beam():
    objective = _objective("sequence", seed=1)
    hand = _Hand(objective)
    ids, mask = objective.generator_inputs(BATCH, ROWS)
    beams = passage_beams(objective, ids, mask, 3, 3, 3)
    assert max(len({y for beam in question for y in beam}) for question in beams) > 2  # beams differ
    thorough = objective.sequence_candidates(BATCH, DOC, ROWS, 3, 3, "thorough")
    fast = objective.sequence_candidates(BATCH, DOC, ROWS, 3, 3, "fast")
    for b in range(2):
        union = [list(y) for y in dict.fromkeys(y for beam in beams[b] for y in beam)]
        assert thorough[b][0] == fast[b][0] == union and all(len(beam) == 3 for beam in beams[b])
        assert thorough[b][1].tolist() == pytest.approx([hand.sequence(b, y) for y in union], abs=1e-5)
        holding = [[z for z in range(3) if tuple(y) in beams[b][z]] for y in union]
        want = [hand.sequence(b, y, zs) for y, zs in zip(union, holding)]
        assert fast[b][1].tolist() == pytest.approx(want, abs=1e-5)
        assert any(len(zs) < 3 for zs in holding)  # some hypothesis is off some passage's beam
        assert bool((fast[b][1] <= thorough[b][1] + 1e-6).all())  # fast drops the passages off y's beam
        for z, beam in enumerate(beams[b]):  # each passage's scores are the search's, best first
            want = [math.log(float(hand.per_passage(b, list(y))[z].prod())) for y in beam]
            assert list(beam.values()) == pytest.approx(want, abs=1e-5) and want == sorted(want, reverse=True)


class _TableSteps:
    """Generator rows (question, passage, beam) whose next-token logits are a fixed random draw per
    (question, passage, prefix): distributions where greedy decoding and narrow beams go wrong."""

    def __init__(self, B: int, K: int, n: int) -> None:
        self.K, self.n = K, n
        self.tokens = torch.full((B * K * n, 1), CLS)

    def table(self, b: int, z: int, prefix: tuple) -> torch.Tensor:
        """(V,) the logits after `prefix` under question b's passage z."""
        seed = zlib.crc32(repr((3, b, z, prefix)).encode())  # draw 3: greedy misses a three-token best
        return 2 * torch.randn(V, generator=torch.Generator().manual_seed(seed))

    def logits(self) -> torch.Tensor:
        rows = self.tokens[:, 1:].tolist()
        return torch.stack([self.table(i // (self.K * self.n), i // self.n % self.K, tuple(r))
                            for i, r in enumerate(rows)])

    def reorder(self, rows: torch.Tensor) -> None:
        self.tokens = self.tokens.index_select(0, rows)

    def append(self, chosen: torch.Tensor) -> None:
        self.tokens = torch.cat([self.tokens, chosen[:, None]], 1)


def test_the_marginal_beam_search_over_fixed_distributions_is_exhaustive_when_wide_and_beats_greedy():
    doc, length = DOC[:, :2].log_softmax(-1), 3  # two questions, two passages each
    table = _TableSteps(2, 2, 1).table

    def score(b, y):  # log prod_i sum_z p(z | x) p(y_i | x, z, y_<i)
        steps = [torch.stack([table(b, z, tuple(y[:i])).log_softmax(-1)[y[i]] for z in range(2)])
                 for i in range(len(y))]
        return sum(float(torch.logsumexp(doc[b] + step, 0)) for step in steps)

    def search(n):
        steps = MarginalSteps(_TableSteps(2, 2, n), doc, n)
        out = beam_search(steps, lambda logp, tokens: logp, Beams(n, 0.0, False, 1), torch.tensor([SEP]),
                          FILL, length)[:, 1:].tolist()
        return [tuple(r[:r.index(SEP) + 1] if SEP in r else r) for r in out]

    greedy, narrow, wide = search(1), search(2), search(20)  # 20: every candidate before the last step
    for b in range(2):
        scores = {tuple(y): score(b, y) for y in _hypotheses(length)}
        assert wide[b] == max(scores, key=scores.get)
        assert scores[narrow[b]] >= scores[greedy[b]]
    assert any(w != g and len(w) == length for w, g in zip(wide, greedy))  # what greedy misses, 3 steps on


def _passes(objective, decoding: str, length: int, num_beams: int) -> tuple:
    """(answers, forward calls that decoded a step of the search, calls that ran the encoder too)."""
    calls = []
    hook = objective.model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(kwargs.get("encoder_output") is None), with_kwargs=True)
    try:
        answers = objective.answer(BATCH, length, num_beams=num_beams, decoding=decoding)
    finally:
        hook.remove()
    return answers, calls.count(False), calls.count(True)


def test_fast_decoding_runs_no_extra_pass_and_equals_thorough_when_every_hypothesis_is_in_every_beam():
    objective = _objective("sequence", seed=1)
    answers, steps, extra = _passes(objective, "fast", 2, 3)
    assert extra == 0 and 1 <= steps <= 2 and len(answers) == 2
    _, _, thorough_extra = _passes(objective, "thorough", 2, 3)
    assert thorough_extra == 2  # one teacher-forced pass over each question's candidates
    every = len(_hypotheses(2))  # 21: a beam this wide holds every answer of two tokens
    ids, mask = objective.generator_inputs(BATCH, ROWS)
    assert all(len(beam) == every for question in passage_beams(objective, ids, mask, 3, 2, every)
               for beam in question)
    fast = objective.sequence_candidates(BATCH, DOC, ROWS, 2, every, "fast")
    thorough = objective.sequence_candidates(BATCH, DOC, ROWS, 2, every, "thorough")
    for (yf, sf), (yt, st) in zip(fast, thorough):
        assert yf == yt and torch.allclose(sf.float(), st, atol=1e-5)
    assert objective.answer(BATCH, 2, every, "fast") == objective.answer(BATCH, 2, every, "thorough")


@pytest.mark.parametrize("kind, fields, field", [("token", {"num_beams": 0}, "num_beams"),
                                                 ("token", {"num_beams": MAX_BEAMS + 1}, "num_beams"),
                                                 ("sequence", {"num_beams": True}, "num_beams"),
                                                 ("sequence", {"decoding": "slow"}, "decoding"),
                                                 ("token", {"decoding": "fast"}, "decoding"),
                                                 ("token", {"max_new_tokens": 10**6}, "max_new_tokens"),
                                                 ("sequence", {"max_new_tokens": -1}, "max_new_tokens"),
                                                 ("sequence", {"max_new_tokens": 0}, "max_new_tokens")])
def test_a_beam_count_out_of_bounds_or_a_decoding_that_does_not_apply_is_refused(kind, fields, field):
    with pytest.raises(OptionsError, match=field) as error:
        _objective(kind).answer(BATCH, **{"max_new_tokens": 2, **fields})
    assert error.value.field == field


@pytest.mark.parametrize("kind, fields", [("token", {"num_beams": MAX_BEAMS + 1}),
                                          ("sequence", {"num_beams": 0}), ("token", {"num_beams": 2.5}),
                                          ("sequence", {"max_new_tokens": 10**6}),
                                          ("token", {"max_new_tokens": True})])
def test_rag_refuses_a_beam_count_or_length_as_generate_does_word_for_word(kind, fields):
    with pytest.raises(OptionsError) as generate:
        GenerationOptions(**fields)
    with pytest.raises(OptionsError) as rag:
        _objective(kind).answer(BATCH, **{"max_new_tokens": 2, **fields})
    assert str(rag.value) == str(generate.value) and rag.value.field == generate.value.field


def test_the_checked_counts_are_read_as_generate_reads_them():
    assert check_decoding(2.0, "thorough", "token", 3.0) == (2, 3)
    assert all(type(n) is int for n in check_decoding(2.0, "fast", "sequence", 3.0))


def test_fast_scores_in_one_batch_are_the_per_candidate_logsumexp():
    """fast_scores' (C, K) table with -inf off a passage's beam gives each candidate's logsumexp over the
    passages whose beam holds it, as a tensor per candidate did, in float64."""
    from lmforge.retrieval.rag_decode import fast_scores

    doc = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    beams = [{(3, 2): -0.1, (4, 2): -1.7}, {(4, 2): -0.4}, {(3, 2): -2.3, (4, 4, 2): -0.05}]
    candidates, scores = fast_scores(beams, doc)
    assert candidates == [(3, 2), (4, 2), (4, 4, 2)] and scores.dtype == torch.float64
    said = doc.tolist()
    for y, score in zip(candidates, scores.tolist()):
        old = torch.logsumexp(torch.tensor([said[z] + beam[y] for z, beam in enumerate(beams) if y in beam],
                                           dtype=torch.float64), 0)
        assert score == pytest.approx(float(old), rel=0, abs=1e-15)
    assert scores[2] == pytest.approx(said[2] - 0.05, abs=1e-15)  # in one beam alone: that passage's term
