"""Attention scaling: one attention layer (masks + projections + attention), T = 512 ... 16384.

Each (variant, T) runs in a fresh process so its peak resident-set growth is its own.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import torch

import lmforge
from bench.common import peak_during, side_by_side
from lmforge.fast.optimize import optimize
from lmforge.fast.paths import FastPaths

LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
# variant -> (ModelConfig fields, FastPaths, longest T it is run at)
VARIANTS = {
    "full": (dict(attention="full"), FastPaths(), 16384),
    "sliding-window 512": (dict(attention="sliding-window", window=512), FastPaths(), 16384),
    "sliding-window 512, dense mask": (dict(attention="sliding-window", window=512),
                                       FastPaths(local_attention="dense"), 8192),
    "bigbird (block 64, r=3)": (dict(attention="bigbird", block_size=64, n_random_blocks=3), FastPaths(), 16384),
    "linformer (k=256)": (dict(attention="linformer", linformer_k=256), FastPaths(), 16384),
}


def layer(variant: str, T: int):
    """(run once, the lmforge attention layer) of a bert-base-sized layer for length T, batch 1."""
    fields, fast, _ = VARIANTS[variant]
    cfg = lmforge.ModelConfig(architecture="encoder", vocab_size=128, d_model=768, n_layers=1, n_heads=12,
                              d_ff=3072, max_seq_len=T, **fields)
    torch.manual_seed(0)
    model = lmforge.build(cfg).eval()
    optimize(model, paths=fast)
    stack, x = model.encoder, torch.randn(1, T, 768)
    positions = torch.arange(T)[None]

    def run():
        with torch.inference_mode():
            ctx = model._context(stack, x, positions, 0, None)  # masks / chunk plans are part of the cost
            return stack.blocks[0].attn(x, ctx, 0, stack.mask_keys[0])

    return run


def measure(variant: str, T: int, repeats: int) -> dict:
    """Peak MiB of the first call (fresh process), then the median seconds of `repeats` calls."""
    run = layer(variant, T)
    memory = peak_during(run, runs=1)
    # one more untimed call: a fresh process's second call still pays first-touch page faults
    timing = side_by_side({"t": run}, repeats, warmup=1)["t"]
    return {"variant": variant, "T": T, "seconds": timing["median"], "peak_mib": round(memory, 1),
            "runs": timing["runs"]}


def scaling_sweep(repeats: int, quick: bool) -> list:
    """Every variant at every length up to its limit (quick: up to 4096)."""
    rows = []
    for variant, (_, _, longest) in VARIANTS.items():
        for T in LENGTHS:
            if T > (4096 if quick else longest):
                continue
            reps = max(1, repeats if T <= 4096 else min(repeats, 3))
            code = ("import json; from bench import attention; "
                    f"print(json.dumps(attention.measure({variant!r}, {T}, {reps})))")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy(),
                                 cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            if out.returncode:
                rows.append({"variant": variant, "T": T, "error": out.stderr.strip().splitlines()[-1][:200]})
                continue
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def slope(rows: list, variant: str, key: str, low: int = 1024) -> float:
    """Least-squares slope of log(key) against log(T) for T >= low (1: linear, 2: quadratic)."""
    points = [(math.log(r["T"]), math.log(max(r[key], 1e-9))) for r in rows
              if r.get("variant") == variant and r["T"] >= low and key in r]
    if len(points) < 2:
        return float("nan")
    mx = sum(p[0] for p in points) / len(points)
    my = sum(p[1] for p in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
