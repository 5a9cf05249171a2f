"""Greedy decoding's argmax over the vocabulary, screened with an int8 copy of the projection.

On CPU at small batches a decoding step is bound by memory bandwidth, and the vocabulary
projection is its biggest single read (GPT-2 small: 154 MB of the ~500 MB each new token reads).
Greedy decoding needs only the argmax of the logits s = h W^T + b. The screen reads an int8 copy
of W (a quarter of the bytes) to score every token together with a rigorous bound on that score's
error, keeps the tokens whose upper bound reaches the best lower bound (the true argmax is always
among them, by construction), and re-scores only those in fp32 from W itself. The chosen token is
the fp32 argmax; only fp32 summation order differs from the full projection, as between any two
fp32 kernels.

The bound. W is first centred: W = c + W', with c the mean row; h.c is the same for every token, so
it never changes an argmax and scores are taken on W'. Each row is quantised with its own scale,
W'_v = Q_v + d_v with Q_v = scale_v q_v (q_v int8) and d_v its residual; the features are quantised
in two integer stages of L levels a side, h = hq + e (L = 127; 63 where the kernel sums u8 x s8
pairs in int16, as AVX2 without VNNI does: 255 x 127 x 2 saturates there, 127 x 127 x 2 does not).
An int8 matmul gives the dot products hq.Q_v exactly (int32), so
    |h.W'_v - hq.Q_v| = |e.Q_v + h.d_v| <= ||e|| ||Q_v|| + ||h|| ||d_v||     (Cauchy-Schwarz)
plus the fp32 rounding of the few steps around it, bounded generously (ROUNDING). Every norm is
rounded up where it is computed, so the bound stays a bound in fp32.
"""
from __future__ import annotations

from typing import Optional

import torch

from lmforge.quant import native
from lmforge.quant.engines import pack_weight
from lmforge.utils.timing import median_seconds
from lmforge.utils.versions import version

MAX_CANDIDATES = 256  # a step with more tokens a row to re-score falls back to the full projection
CHUNK = 8192  # rows quantised at a time
ROUNDING = 2.0 ** -18  # fp32 rounding of the screened scores, relative to ||h|| ||Q_v|| (generous)
MAX_DIM = 2 ** 14  # feature sizes the rounding allowances are worked out for
FEATURE_LEVELS = (127, 63)  # the features' levels a side, tried in turn until a kernel is exact with them
KINDS = ("w8a32", "fbgemm", "onednn", "int_mm")  # Int8Matmul's kernels: the table times the exact ones


_FINGERPRINT_VECTORS: dict = {}  # size -> fixed random vector, for fingerprints


def _fingerprint_vector(n: int) -> torch.Tensor:
    if n not in _FINGERPRINT_VECTORS:
        _FINGERPRINT_VECTORS[n] = torch.randn(n, generator=torch.Generator().manual_seed(n))
    return _FINGERPRINT_VECTORS[n]


def _fingerprint(tensor: torch.Tensor):
    """r_V . (W r_d) for fixed random r (r . b for a vector): catches writes that bypass the version
    counter (through tensor.data), swapped rows included. Reads the weight once, about what one
    step's full projection reads. NaN as a string, which equals itself."""
    x = tensor.detach().float()
    if x.dim() == 2:
        x = torch.mv(x, _fingerprint_vector(x.shape[1]))
    total = float(torch.dot(x.double(), _fingerprint_vector(x.shape[0]).double()))
    return total if total == total else "nan"


def table_key(weight: torch.Tensor, bias: Optional[torch.Tensor]) -> tuple:
    """What identifies the weights a table was built from: storage, shape, layout, in-place writes."""
    parts = [weight.data_ptr(), tuple(weight.shape), weight.stride(), version(weight), _fingerprint(weight)]
    if bias is not None:
        parts += [bias.data_ptr(), version(bias), _fingerprint(bias)]
    return tuple(parts)


def quantise_features(h: torch.Tensor, levels: int = 127) -> tuple:
    """(N, d) fp32 -> (2N, d) integer rows [q1; q2] in [-L, L] (L = levels) of each row with
    h ~ (a / L) (q1 + q2 / 2L), the (N, 1) largest |h_i| a and (N, 1) ||h|| / a (not finite where h is
    not, is 0, or a < ~1e-36). Two stages, the second on the first's residual (|L h / a - q1| <= 1/2),
    keep outlier features from costing the rest their precision: each |e_i| <= a / (2 L 2L), plus fp32's
    rounding of y (<= 2^-22 a, which the table's e_term allows)."""
    a = torch.linalg.vector_norm(h, float("inf"), dim=1, keepdim=True)  # (N, 1)
    y = h * (levels / a)
    ratio = torch.linalg.vector_norm(y, dim=1, keepdim=True).div_(levels)  # ||h|| / a, free of under/overflow
    q1 = y.round()
    q2 = y.sub_(q1).mul_(2 * levels).round_()
    return torch.cat([q1, q2], dim=1).view(-1, h.shape[1]), a, ratio  # integer-valued fp32 rows


def _probe_pair(d: int, levels: int = 127) -> tuple:
    """(66, d) integer activations in [-levels, levels] and (67, d) int8 weights with the extremes a
    kernel might mishandle (16-bit pair sums saturate at 127 x 255 x 2 when activations are shifted to
    uint8); row counts that no kernel's blocks divide, so their leftover paths are probed too."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(-levels, levels + 1, (66, d), generator=generator)
    w = torch.randint(-127, 128, (67, d), generator=generator)
    x[0], x[1], w[0], w[1] = levels, -levels, 127, -127
    return x, w.to(torch.int8)


class Int8Matmul:
    """(M, d) integer rows in [-L, L] (L = levels) times a fixed (V, d) int8 matrix q with per-row scales:
    (M, V) fp32 scale_v sum_i x_i q_vi, the integer sums exact. The first kind a probe finds exact:
    lmforge's native w8a32 (quant/native.py: int8 widened to fp32, exact while every partial sum stays
    below 2^24, d L 127 < 2^24; GPT-2's vocabulary at 2 rows: 3.3 ms on an AVX2-only EPYC), fbgemm's
    u8 x s8 product on its packed weight, the activations' range given (0.89 ms on an AVX-512 VNNI EPYC,
    1.5 with AVX2 code and 7-bit activations, 3.0 on the AVX2-only EPYC), oneDNN's (1.19; 7.2 with AVX2
    code; 17 on the AVX2-only EPYC), torch._int_mm on the plain int8 matrix (2.4; inexact with AVX2
    code on a VNNI CPU; 47 and exact on the AVX2-only EPYC); `kind` is None where none is."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, kinds: tuple = KINDS, levels: int = 127) -> None:
        """q (V, d) int8, scale (V,) fp32; kinds: the kernels to try, in order; levels: the activations'."""
        self.zero_point = levels + 1  # u8 x s8 kernels' activations are unsigned: [-L, L] -> [1, 2L + 1]
        x, w = _probe_pair(q.shape[1], levels)
        exact = (x @ w.long().t()).float()
        for kind in kinds:
            try:
                self.kind, self.weight = kind, self._prepare(kind, w, torch.ones(w.shape[0]))
                # exact integer sums, converted to fp32 once: a saturating or rounding kernel differs
                if all(torch.equal(self(x[:m].float()), exact[:m]) for m in (2, 16, 66)):
                    self.weight = self._prepare(kind, q, scale)
                    return
            except (AttributeError, RuntimeError):
                pass
        self.kind = self.weight = None

    def _prepare(self, kind: str, q: torch.Tensor, scale: torch.Tensor) -> tuple:
        if kind == "w8a32":  # fp32 sums: exact while no partial sum can reach 2^24 (the probe's may be even)
            if native.library() is None or q.shape[1] * (self.zero_point - 1) * 127 >= 1 << 24:
                raise RuntimeError("no native library here, or sums past fp32's exact integers")
            return (native.Int8Tiles(q, scale.float()),)
        if kind == "fbgemm":
            packed = pack_weight("fbgemm", q, scale)
            if packed is None:
                raise RuntimeError("fbgemm is not in this build")
            return (packed,)
        if kind == "onednn":
            packed = torch.ops.onednn.qlinear_prepack(q, None)
            return packed, scale, torch.zeros(q.shape[0], dtype=torch.long)
        return q, scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(M, d) integer-valued fp32 -> (M, V) fp32."""
        if self.kind == "w8a32":
            return self.weight[0](x)
        if self.kind == "fbgemm":  # scale 1: x + zero point are the u8 values themselves
            op = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32  # missing: probe skips
            return op(x, 1.0, self.zero_point, self.weight[0])
        if self.kind == "onednn":
            packed, scale, zero = self.weight
            shifted = (x + self.zero_point).to(torch.uint8)
            return torch.ops.onednn.qlinear_pointwise(shifted, 1.0, self.zero_point, packed, scale, zero,
                                                      None, 1.0, 0, torch.float32, "none", [], "")
        q, scale = self.weight
        return torch._int_mm(x.to(torch.int8), q.t()).float().mul_(scale)


def fastest_matmul(q: torch.Tensor, scale: torch.Tensor) -> tuple:
    """(levels, Int8Matmul, {kind: ms}) for the (V, d) int8 table q with scales `scale`: each kind at the
    finest FEATURE_LEVELS it sums exactly, timed on a step's two feature rows; the fastest is kept (the
    fastest exact kind differs by CPU, and the first exact one could be 15x slower: int_mm on an AVX2-only
    EPYC). A matmul of kind None where no kind is exact."""
    best, times, rows = None, {}, torch.Generator().manual_seed(0)
    for kind in KINDS:
        for levels in FEATURE_LEVELS:  # a kind runs as fast at any levels: the finest exact one is taken
            matmul = Int8Matmul(q, scale / (levels * 2 * levels), kinds=(kind,), levels=levels)
            if matmul.kind is not None:
                x = torch.randint(-levels, levels + 1, (2, q.shape[1]), generator=rows).float()
                times[kind] = median_seconds(lambda matmul=matmul, x=x: matmul(x)) * 1e3
                if best is None or times[kind] < times[best[1].kind]:
                    best = (levels, matmul)  # the slower copies are dropped as they lose
                break
    if best is None:
        return FEATURE_LEVELS[-1], Int8Matmul(q[:0], scale[:0], kinds=()), times
    return (*best, times)


class ScreenTable:
    """An int8 copy of a (V, d) vocabulary projection with the per-token norms the bound needs."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 key: Optional[tuple] = None) -> None:
        """weight (V, d) fp32 on CPU, any layout; bias (V,) or None; key: their table_key, if known."""
        if weight.dtype != torch.float32 or weight.dim() != 2 or weight.device.type != "cpu":
            raise ValueError("a screen table is built from a 2-D fp32 CPU weight")
        self.key, self.bias = key or table_key(weight, bias), bias
        W = weight.detach()
        V, d = W.shape
        # any fixed vector may be taken out of every row; the mean row leaves the smallest scores
        self.center = sum(W[i:i + CHUNK].sum(0, dtype=torch.float64) for i in range(0, V, CHUNK)).float() / V
        q, scale = torch.empty(V, d, dtype=torch.int8), torch.empty(V)
        self.norms = torch.zeros(2, V)  # per token: ||Q_v||, ||d_v|| (Q_v = scale_v q_v), rounded up
        finite = bool(torch.isfinite(self.center).all())
        for i in range(0, V, CHUNK):
            finite &= self._quantise(W[i:i + CHUNK], i, q, scale)
        if bias is not None:
            finite &= bool(torch.isfinite(bias).all())
        self.levels, self.matmul, self.kinds_ms = fastest_matmul(q, scale)
        # in units of a row's largest feature a: t = hq.Q_v / a; ||e|| / a and ||h|| / a are at most sqrt(d)
        # times a constant, so the ||e|| ||Q_v|| and rounding terms of the bound are fixed per token
        L = self.levels
        self.e_term = self.norms[0] * (d ** 0.5 * (1 / (2 * L * 2 * L) + 2.0 ** -22 + ROUNDING))
        finite &= bool(torch.isfinite(self.e_term).all() and torch.isfinite(self.norms).all())
        # the fp32 rounding allowances hold for d <= 2^14 (the per-call ||h|| / a sums d squares)
        self.usable = finite and d <= MAX_DIM and self.matmul.kind is not None

    def _quantise(self, rows: torch.Tensor, start: int, q: torch.Tensor, scale: torch.Tensor) -> bool:
        """Quantise (n, d) rows into q and scale from row `start`, their norms into the table;
        False if any is not finite."""
        centred = rows.contiguous() - self.center  # (n, d); a generate call's weights are input-major
        end = start + rows.shape[0]
        peak = torch.linalg.vector_norm(centred, float("inf"), dim=1)
        # a normal scale (a row of tiny values keeps scale 1: its levels are 0, its residual is the row)
        s = torch.where(peak > 2.0 ** -100, peak / 127, torch.ones_like(peak))
        y = centred / s[:, None]  # within [-127, 127] up to rounding
        codes = y.round().clamp_(-127, 127)
        q[start:end], scale[start:end] = codes, s
        # norms in float64 (no underflow), then rounded up: ||Q_v|| = s ||q_v|| for the cast; ||d_v|| =
        # s ||y - q_v|| also for y's rounding (absolute: the 2^-22 ||centred|| term, which covers the
        # centring's rounding too) and for the ratio ||h|| / a it meets (< 2^-10 relative, d <= 2^14)
        s64 = s.double()
        self.norms[0, start:end] = (codes.double().norm(dim=1) * s64 * (1 + 2.0 ** -10)).float()
        residual = (y.double() - codes.double()).norm(dim=1) * s64
        self.norms[1, start:end] = (residual * (1 + 2.0 ** -9)
                                    + centred.double().norm(dim=1) * 2.0 ** -22).float()
        return bool(torch.isfinite(peak).all())

    def scores(self, h: torch.Tensor) -> tuple:
        """(N, d) fp32 features -> (N, V) screened scores t of h.(W_v - c) + b_v and (N, V) error bounds,
        both divided by the row's largest |h_i| (a positive factor per row changes no comparison
        within it), and (N, 1) ||h|| / max |h_i| (not finite where h is not)."""
        N = h.shape[0]
        hq, a, ratio = quantise_features(h, self.levels)
        dots = self.matmul(hq).view(N, 2, -1)  # q1.Q_v and q2.Q_v, over L x 2L
        t = torch.add(dots[:, 1], dots[:, 0], alpha=2 * self.levels)  # (N, V): hq.Q_v / a
        bound = torch.addcmul(self.e_term, self.norms[1], ratio)
        if self.bias is not None:  # in the same units, with its fp32 rounding in the bound
            t.add_(self.bias / a)
            bound.add_(self.bias.abs() * ROUNDING / a)
        return t, bound, ratio


class GreedyScreen:
    """One generate call's screened argmax over a head's projection (weight (V, d), bias)."""

    def __init__(self, table: ScreenTable, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        """table: built from weight and bias (ScreenTable.key)."""
        self.table, self.weight, self.bias = table, weight, bias
        self.calls = self.fallbacks = 0

    @property
    def active(self) -> bool:
        """False once most calls have needed the full projection: the screen then costs, not saves."""
        return self.calls < 8 or self.fallbacks * 2 <= self.calls

    @torch.no_grad()
    def __call__(self, h: torch.Tensor) -> Optional[torch.Tensor]:
        """(N, d) fp32 features -> (N,) argmax of h W^T + b, or None where the screen cannot decide
        cheaply (features not fp32 or not finite, or more than MAX_CANDIDATES tokens a row to re-score)."""
        self.calls += 1
        if h.dtype != torch.float32:  # e.g. under autocast: the bound is worked out for fp32 features
            return self._fallback()
        t, bound, ratio = self.table.scores(h)
        if not bool(torch.isfinite(ratio).all()):  # features with inf or NaN, all zero or tiny
            return self._fallback()
        best_lower = (t - bound).amax(1, keepdim=True)  # (N, 1)
        # the true argmax's upper bound reaches every token's lower bound, the best one's included
        rows, ids = (t.add_(bound) >= best_lower).nonzero(as_tuple=True)  # row-major: ids ascend per row
        N = h.shape[0]
        if not 0 < ids.numel() <= MAX_CANDIDATES * N:  # none: only where a score overflowed
            return self._fallback()
        candidates = self.weight.index_select(0, ids)  # (k, d)
        if N == 1:
            exact = (torch.mv(candidates, h[0]) if self.bias is None
                     else torch.addmv(self.bias[ids], candidates, h[0]))
            return ids[exact.argmax()].view(1)  # ascending ids: argmax's first maximum
        exact = (candidates * h.index_select(0, rows)).sum(1)  # (k,)
        if self.bias is not None:
            exact += self.bias.index_select(0, ids)
        chosen = _first_maximum(rows, ids, exact, N)
        return chosen if int(chosen.max()) < self.weight.shape[0] else self._fallback()  # a row without any

    def _fallback(self) -> None:
        self.fallbacks += 1
        return None


def _first_maximum(rows: torch.Tensor, ids: torch.Tensor, scores: torch.Tensor, n: int) -> torch.Tensor:
    """(k,) candidates as row, token id and exact score -> (n,) each row's lowest id among its best scores
    (argmax's rule for ties)."""
    best = scores.new_full((n,), float("-inf")).scatter_reduce_(0, rows, scores, "amax")
    last = torch.iinfo(ids.dtype).max
    ties = torch.where(scores == best.index_select(0, rows), ids, torch.full_like(ids, last))
    return ids.new_full((n,), last).scatter_reduce_(0, rows, ties, "amin")
