"""The rational erf behind the fused int8 FFN's GELU (quant/csrc/rowquant.c): erf(u) ~ u P(u^2) / Q(u^2)
on [0, 3.92] (erf rounds to 1 in fp32 beyond), P and Q of degree 5, Q(0) = 1.

Linearised least squares (u P(s) - erf(u) Q(s) = 0 at 20,001 points), the weights then moved towards
the points of largest error and 1 / Q (Lawson's and Loeb's iterations); the best of 60 rounds is kept.
Prints the coefficients and the largest error in float64 and evaluated in fp32 (Horner's rule), over
[0, 6]: `python -m bench.erf_fit`.
"""
from __future__ import annotations

import argparse
from math import erf

import numpy as np

EDGE = 3.92


def fit(dp: int = 5, dq: int = 5, rounds: int = 60, points: int = 20001) -> tuple:
    """(largest error, P coefficients from s^0, Q coefficients from s^0) of the best round."""
    u = np.linspace(1e-6, EDGE, points)
    f, s = np.array([erf(v) for v in u]), u * u
    w, best = np.ones_like(u), None
    for _ in range(rounds):
        a = np.hstack([np.stack([u * s ** k for k in range(dp + 1)], 1),
                       np.stack([-f * s ** k for k in range(1, dq + 1)], 1)])
        sol = np.linalg.lstsq(a * w[:, None], f * w, rcond=None)[0]
        p, q = sol[:dp + 1], np.concatenate([[1.0], sol[dp + 1:]])
        err = u * np.polyval(p[::-1], s) / np.polyval(q[::-1], s) - f
        top = np.abs(err).max()
        if best is None or top < best[0]:
            best = (top, p, q)
        w = w * (np.abs(err) / top + 1e-3) ** 0.5 / np.abs(np.polyval(q[::-1], s))
        w /= w.max()
    return best


def fp32_error(p, q) -> float:
    """Largest |error| of the fit evaluated as the C code does (fp32, clamped at EDGE) over [0, 6]."""
    u = np.linspace(0, 6, 200001).astype(np.float32)
    a = np.minimum(u, np.float32(EDGE))
    s = a * a
    num, den = np.float32(p[-1]), np.float32(q[-1])
    for cp, cq in zip(p[-2::-1], q[-2::-1]):
        num, den = num * s + np.float32(cp), den * s + np.float32(cq)
    approx = np.minimum(a * num / den, np.float32(1))
    return float(np.abs(approx - np.array([erf(float(v)) for v in u])).max())


def main() -> None:
    """Fit, print the coefficients and the largest errors."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    top, p, q = fit()
    print("P", ", ".join(f"{c:.10g}" for c in p))
    print("Q", ", ".join(f"{c:.10g}" for c in q))
    print(f"largest error: {top:.2e} (float64), {fp32_error(p, q):.2e} (fp32)")


if __name__ == "__main__":
    main()
