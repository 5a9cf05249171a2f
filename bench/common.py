"""Shared by the benchmarks: side-by-side timing, peak memory, model pairs with one set of weights."""
from __future__ import annotations

import os
import platform
import re
import statistics
import tempfile
from pathlib import Path

import torch

import lmforge
from lmforge.fast.paths import FastPaths
from lmforge.utils.timing import rounds_of

# BERT sizes (Turc et al. 2019, "Well-Read Students Learn Better", table 1 for mini/small)
BERT_SIZES = {"bert-mini": (4, 256, 4), "bert-small": (4, 512, 8), "bert-base": (12, 768, 12)}


def _status(field: str) -> int:
    """A /proc/self/status memory field in KiB."""
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def rss_mib() -> float:
    """Resident set size now, MiB."""
    return _status("VmRSS") / 1024


def reset_peak() -> None:
    """Start a new resident-set high-water mark (Linux: write 5 to clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_mib() -> float:
    """Resident-set high-water mark since the last reset_peak(), MiB."""
    return _status("VmHWM") / 1024


def peak_during(fn, runs: int = 2) -> float:
    """MiB the resident set grew above its level before `runs` calls of fn (call in a fresh process)."""
    base = rss_mib()
    reset_peak()
    for _ in range(runs):
        fn()
    return peak_mib() - base


def side_by_side(fns: dict, repeats: int, warmup: int = 1) -> dict:
    """Seconds of each fn over `repeats` rounds, the order reversed every other round so that drift
    (other load, heat) falls on both alike (lmforge.utils.timing.rounds_of, autograd left as it is:
    training steps are timed too): name -> {"median", "runs"}."""
    runs = rounds_of(fns, repeats, warmup=warmup, zigzag=True)
    return {name: {"median": statistics.median(t), "runs": t} for name, t in runs.items()}


def pair(reference) -> tuple:
    """(reference in eval mode, the lmforge model read from its saved directory and optimized): same
    weights."""
    reference.eval()
    with tempfile.TemporaryDirectory() as tmp:
        reference.save_pretrained(tmp)
        ours = lmforge.load(tmp)
    # as lmforge's inference jobs run a model: optimized, its weights read as frozen (packed once)
    return reference, lmforge.optimize(ours.eval(), paths=FastPaths.frozen())


def bert_config(name: str, **extra):
    """The reference library's BertConfig of a BERT size."""
    from transformers import BertConfig

    layers, d, heads = BERT_SIZES[name]
    return BertConfig(num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads,
                      intermediate_size=4 * d, **extra)


def batch(size: int, length: int, vocab: int, variable: bool, seed: int = 0) -> tuple:
    """(ids, mask) (size, length): every row full, or lengths uniform in 8..length (right-padded)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (size, length), generator=gen)
    lengths = (torch.randint(8, length + 1, (size,), generator=gen) if variable
               else torch.full((size,), length))
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def encoder_flops(layers: int, d: int, d_ff: int, mask: torch.Tensor) -> float:
    """Useful forward FLOPs of an encoder on the real tokens: 2 x matmul weights per token plus
    attention (q k^T and p v: 4 d per query-key pair of a sequence with itself)."""
    lengths = mask.sum(1).double()
    per_token = 2 * (4 * d * d + 2 * d * d_ff)
    return float(layers * (per_token * lengths.sum() + 4 * d * (lengths ** 2).sum()))


def ratio(ours: float, theirs: float) -> float:
    """ours / theirs, rounded for the report."""
    return round(ours / theirs, 3) if theirs else float("nan")


def cpu_name() -> str:
    """The processor's model name (/proc/cpuinfo), else the machine type: what every result names."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                platform.machine())


CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni",
             "amx_int8")  # what a result names


def machine() -> dict:
    """The CPU, its vector flags, cores, threads and versions: what every result is measured on."""
    from importlib.metadata import PackageNotFoundError, version

    try:  # a dev extra: a bare borrowed machine may lack it, and its results still name the machine
        transformers = version("transformers")
    except PackageNotFoundError:
        transformers = "not installed"
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    # family and model tell CPUs of one name apart: "AMD EPYC" family 25 model 17 is Zen 4, 26 is Zen 5
    pairs = (line.split(":", 1) for line in lines[:30] if ":" in line)  # the first processor's fields
    fields = {key.strip(): value.strip() for key, value in pairs}
    family, model = fields.get("cpu family", "unknown"), fields.get("model", "unknown")
    return {"cpu": cpu_name(), "cpu_family": family, "cpu_model": model,
            "cpu_flags": [f for f in CPU_FLAGS if f in flags], "cores": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers, "python": platform.python_version()}
