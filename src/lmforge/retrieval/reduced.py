"""Retrieval from reduced embeddings: how much of fp32 recall@k survives Matryoshka truncation and binary
quantization, on the same query and passage vectors.

- fp32: exact inner product (cosine for normalised vectors).
- truncated: the first `dims` coordinates of both, renormalised (Matryoshka, Kusupati et al. 2022; the
  cut of pipelines/embed_options.cut_dimensions, as `lmforge embed dimensions=k` gives it).
- binary: the sign bits of both (1 where a coordinate > 0), packed as embed_options.quantize's ubinary;
  the passages ranked by Hamming distance to the query's bits (ties: the lower passage index first).
- binary + rescoring, as sentence-transformers' semantic_search_* (quantization.py, rescore=True): the
  rescore_multiplier * k nearest by Hamming distance are re-ordered by the fp32 query's inner product
  with their binary vectors unpacked to +-1 (not with their fp32 vectors: only the bits are kept in
  the index). Unpacking to {0, 1} instead orders alike: q . b01 = (q . b+-1 + sum(q)) / 2, the same
  shift for every passage of one query.
"""
from __future__ import annotations

import torch

from lmforge.pipelines.embed_options import EmbedOptions, cut_dimensions, quantize
from lmforge.retrieval.index import top_inner_products

_BITS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)  # quantize's big-endian bit order


def pack_bits(vectors: torch.Tensor) -> torch.Tensor:
    """(N, d) floats -> (N, ceil(d / 8)) uint8 sign bits (embed_options' ubinary encoding)."""
    return quantize(vectors.float(), "ubinary")


def unpack_signs(packed: torch.Tensor, d: int) -> torch.Tensor:
    """(N, ceil(d / 8)) packed bits -> (N, d) float +1 / -1 (the padding bits of the last byte dropped)."""
    bits = (packed.to(torch.uint8)[..., None] & _BITS).ne(0)
    return bits.reshape(*packed.shape[:-1], -1)[..., :d].float() * 2 - 1


def hamming(queries: torch.Tensor, passages: torch.Tensor, chunk: int = 1024,
            passage_chunk: int = 8192) -> torch.Tensor:
    """(Q, B) and (N, B) packed bits -> (Q, N) int32 Hamming distances. With the bits as +-1 vectors a, b
    of 8B (the last byte's padding bits alike on both sides), a . b = 8B - 2 h: one matrix product per
    `chunk` queries by `passage_chunk` passages, exact in fp32 (integer sums far below 2^24), memory
    ~ (chunk + passage_chunk) x 8B x 4 + chunk x passage_chunk x 4 bytes whatever N is."""
    width = 8 * queries.shape[-1]
    out = torch.empty(len(queries), len(passages), dtype=torch.int32)
    for p in range(0, len(passages), passage_chunk):
        b = unpack_signs(passages[p:p + passage_chunk], width)
        for q in range(0, len(queries), chunk):
            dots = unpack_signs(queries[q:q + chunk], width) @ b.T
            out[q:q + chunk, p:p + passage_chunk] = dots.neg_().add_(width).div_(2).round_().to(torch.int32)
    return out


def float_search(queries: torch.Tensor, passages: torch.Tensor, k: int) -> torch.Tensor:
    """(Q, k) passage positions by inner product, best first."""
    return top_inner_products(queries.float(), passages.float(), k)[1]


def truncated_search(queries: torch.Tensor, passages: torch.Tensor, k: int, dims: int) -> torch.Tensor:
    """(Q, k) passage positions by the inner product of the first `dims` coordinates, renormalised."""
    options = EmbedOptions(dimensions=dims)
    return float_search(cut_dimensions(queries.float(), options),
                        cut_dimensions(passages.float(), options), k)


def binary_search(queries: torch.Tensor, passages: torch.Tensor, k: int,
                  rescore_multiplier: int = 0) -> torch.Tensor:
    """(Q, k) passage positions from sign bits: the k nearest by Hamming distance, or with
    rescore_multiplier >= 1 the rescore_multiplier * k nearest re-ordered by the fp32 query's inner
    product with their +-1 vectors (see the module's docstring)."""
    return binary_searches(queries, passages, k, (rescore_multiplier,))[rescore_multiplier]


def binary_searches(queries: torch.Tensor, passages: torch.Tensor, k: int,
                    rescore_multipliers: tuple) -> dict:
    """{m: binary_search(queries, passages, k, m)} for each m, the bits packed, the distances taken and
    sorted once for all of them."""
    if any(m < 0 for m in rescore_multipliers):
        raise ValueError(f"rescore_multiplier must be >= 0, got {min(rescore_multipliers)}")
    n, d = passages.shape
    packed = pack_bits(passages)
    distances = hamming(pack_bits(queries), packed)
    wanted = min(n, k * max(1, *rescore_multipliers))
    # a stable sort, so that ties (common in Hamming distance) fall to the lower index, run after run
    order = torch.sort(distances, dim=-1, stable=True).indices[:, :wanted]  # (Q, wanted)
    found = {}
    for m in rescore_multipliers:
        candidates = order[:, :min(n, k * max(1, m))]
        if not m:
            found[m] = candidates[:, :k]
            continue
        signs = unpack_signs(packed[candidates], d)  # (Q, m k, d)
        scores = torch.einsum("qd,qcd->qc", queries.float(), signs)
        best = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
        found[m] = torch.gather(candidates, 1, best)
    return found


def reduced_rankings(queries: torch.Tensor, passages: torch.Tensor, ids: list, k: int, dims: int,
                     rescore_multipliers: tuple = (4,)) -> dict:
    """{"fp32", f"first {dims}", "binary", f"binary rescored x{m}" for each m: each question's top-k
    passage ids} from fp32 query and passage embeddings (rows of `passages` are `ids`)."""
    def named(positions: torch.Tensor) -> list:
        return [[ids[int(i)] for i in row] for row in positions]

    table = {"fp32": named(float_search(queries, passages, k)),
             f"first {dims}": named(truncated_search(queries, passages, k, dims))}
    binary = binary_searches(queries, passages, k, (0, *rescore_multipliers))
    table["binary"] = named(binary[0])
    for m in rescore_multipliers:
        table[f"binary rescored x{m}"] = named(binary[m])
    return table
