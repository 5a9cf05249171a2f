"""Search over reduced embeddings (retrieval/reduced.py): Hamming distances of packed sign bits equal the
count of differing signs, binary search with rescoring over every passage is the exhaustive ordering of the
fp32 query against the +-1 vectors, a Matryoshka cut ranks as the renormalised prefix does, and a search
with all its bits or coordinates kept matches fp32 where the signs carry the ranking."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from lmforge.pipelines.embed_options import quantize
from lmforge.retrieval.reduced import (binary_search, float_search, hamming, pack_bits, reduced_rankings,
                                       truncated_search, unpack_signs)


def _unit(n, d, seed):
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=-1)


@pytest.mark.parametrize("d", [8, 13, 64])
def test_packing_round_trips_the_signs_and_hamming_counts_differing_signs(d):
    q, p = _unit(5, d, 0), _unit(40, d, 1)
    assert torch.equal(pack_bits(p), quantize(p, "ubinary"))
    assert torch.equal(unpack_signs(pack_bits(p), d), torch.where(p > 0, 1.0, -1.0))
    want = ((q[:, None] > 0) != (p[None] > 0)).sum(-1)
    assert torch.equal(hamming(pack_bits(q), pack_bits(p), chunk=2, passage_chunk=7).long(), want)
    assert torch.equal(hamming(pack_bits(q), pack_bits(p)).long(), want)


def test_rescoring_over_every_passage_is_the_exhaustive_ordering_against_the_signs():
    q, p = _unit(6, 24, 2), _unit(30, 24, 3)
    exhaustive = torch.sort(q @ torch.where(p > 0, 1.0, -1.0).T, dim=-1, descending=True, stable=True).indices
    assert torch.equal(binary_search(q, p, 5, rescore_multiplier=6), exhaustive[:, :5])  # 5 * 6 = all 30
    assert torch.equal(binary_search(q, p, 5, rescore_multiplier=100), exhaustive[:, :5])


def test_binary_without_rescoring_ranks_by_hamming_distance_ties_to_the_lower_index():
    q, p = _unit(4, 16, 4), _unit(50, 16, 5)
    got = binary_search(q, p, 10)
    distances = ((q[:, None] > 0) != (p[None] > 0)).sum(-1)
    for row, dist in zip(got, distances):
        assert torch.equal(dist[row], torch.sort(dist).values[:10])  # the 10 smallest distances
        for a, b in itertools.pairwise(row.tolist()):  # ordered, and equal distances by index
            assert dist[a] < dist[b] or (dist[a] == dist[b] and a < b)


def test_rescoring_only_reorders_and_keeps_the_hamming_candidates():
    q, p = _unit(8, 32, 6), _unit(200, 32, 7)
    candidates = binary_search(q, p, 20)
    rescored = binary_search(q, p, 5, rescore_multiplier=4)
    for got, pool in zip(rescored, candidates):
        assert set(got.tolist()) <= set(pool.tolist())


def test_a_sign_identical_corpus_ranks_alike_in_every_form():
    # passages that are +-1 / sqrt(d) vectors lose nothing to their bits: binary + rescoring over all of them
    # is the fp32 ranking, and each query (a passage, jittered) is nearest its own passage by Hamming distance
    signs = torch.where(_unit(40, 16, 8) > 0, 1.0, -1.0) / 4
    q = signs[:6] + 0.01 * _unit(6, 16, 9)
    assert torch.equal(binary_search(q, signs, 3, rescore_multiplier=14), float_search(q, signs, 3))
    assert torch.equal(binary_search(q, signs, 1)[:, 0], torch.arange(6))


def test_truncation_ranks_by_the_renormalised_prefix():
    q, p = _unit(5, 32, 10), _unit(60, 32, 11)
    want = float_search(F.normalize(q[:, :8], dim=-1), F.normalize(p[:, :8], dim=-1), 7)
    assert torch.equal(truncated_search(q, p, 7, 8), want)
    assert torch.equal(truncated_search(q, p, 7, 32), float_search(q, p, 7))


def test_reduced_rankings_names_each_form_and_maps_ids():
    q, p = _unit(3, 16, 12), _unit(20, 16, 13)
    ids = [f"p{i}" for i in range(20)]
    table = reduced_rankings(q, p, ids, 4, 4, rescore_multipliers=(1, 5))
    assert list(table) == ["fp32", "first 4", "binary", "binary rescored x1", "binary rescored x5"]
    assert table["fp32"] == [[ids[int(i)] for i in row] for row in float_search(q, p, 4)]
    assert all(len(row) == 4 for rows in table.values() for row in rows)
