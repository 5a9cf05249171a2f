"""The machine's matmul ceiling (GFLOP/s), the denominator of model FLOPs utilisation."""
from __future__ import annotations

import torch

from bench.common import side_by_side


def matmul_peak(repeats: int, quick: bool) -> list:
    """Median GFLOP/s of a square matmul in fp32 and bf16 (the best size of a few)."""
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        best = 0.0
        for n in ((2048,) if quick else (1024, 2048, 3072)):
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            seconds = side_by_side({"mm": lambda: a @ b}, max(repeats, 3))["mm"]["median"]
            best = max(best, 2 * n ** 3 / seconds / 1e9)
        rows.append({"dtype": str(dtype).replace("torch.", ""), "gflops": round(best, 1),
                     "threads": torch.get_num_threads()})
    return rows
