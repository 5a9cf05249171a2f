"""Bidirectional attention for CPU inference in a native library of its own (fast/csrc/attention.c).

At sentence encoders' sizes (T <= 128, dh = 32 or 64) SDPA's CPU kernel runs at under half the products'
rate, and a second thread gives it 1.6-1.7x (none at 14 tokens). The native kernel runs every (sequence,
head) of a batch as one task of one parallel region, in registers and L1: 2.3x SDPA at (32, 12, 64, 32)
on two threads of an AVX-512 EPYC, 3.8x at 14 tokens, 1.5x at (32, 12, 128, 64) (bench/FINDINGS.md).
It reads the fused projection's strided views and packed rows of any lengths (no re-padding, no
mask), and writes its output where the output projection reads it. No backward: inference only.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from lmforge.quant import native

MAX_LENGTH = 1024  # its keys' work space is dh x T per thread; past this SDPA's blocked kernel is the choice
NAME = "lmforge-attention"  # the library's file in quant/native.py's folder: NAME-<digest>.so
SOURCE = Path(__file__).with_name("csrc") / "attention.c"


@functools.cache
def library():
    """The loaded kernel (ctypes), built by quant/native.py's `load`, or None where there is none."""
    lib = native.load(NAME, (SOURCE,), "attention runs SDPA")
    if lib is not None:
        row = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long]  # a tensor's data, row and head strides
        lib.attend_rows.argtypes = row * 4 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long,
                                              ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_int,
                                              ctypes.c_int, ctypes.c_float, ctypes.c_int]
        lib.attend_rows.restype = ctypes.c_int
        lib.attention_vector_width.argtypes, lib.attention_vector_width.restype = [], ctypes.c_int
    return lib


def vector_width() -> int:
    """Floats per vector of the built kernel (16: AVX-512, 8: AVX2), or 0 where there is none here."""
    lib = library()
    return 0 if lib is None else int(lib.attention_vector_width())


def supports(dh: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the kernel can run heads of size dh in dtype on device: fp32 on the CPU, dh a multiple
    of the vector width."""
    width = vector_width() if device.type == "cpu" and dtype == torch.float32 else 0
    return width > 0 and dh % width == 0


def _rows(t: torch.Tensor, name: str) -> tuple:
    """(row stride, head stride) of a (N, H, dh) view whose rows and heads the kernel steps through."""
    if t.dim() != 3 or t.stride(-1) != 1 or t.dtype != torch.float32 or t.device.type != "cpu":
        raise ValueError(f"{name}: an (N, heads, dh) float32 CPU view with contiguous heads expected, got "
                         f"{tuple(t.shape)} strides {t.stride()} {t.dtype} on {t.device}")
    return t.stride(0), t.stride(1)


def _spans(starts: torch.Tensor, lengths: torch.Tensor, n: int) -> None:
    """ValueError unless the sequences are int64 CPU (S,) spans within the n rows."""
    if any(t.dtype != torch.int64 or t.device.type != "cpu" or t.dim() != 1 for t in (starts, lengths)) \
            or starts.shape != lengths.shape:
        raise ValueError("starts, lengths: int64 (S,) CPU tensors of one shape expected")
    if len(lengths) and (int(starts.min()) < 0 or int(lengths.min()) < 0 or int(starts.max()) > n
                         or int(lengths.max()) > n or int((starts + lengths).max()) > n):
        raise ValueError(f"starts, lengths: every sequence within the {n} rows expected")


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor,
                lengths: torch.Tensor, scale: float, key_bias: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + key_bias) v for each sequence of rows: q (N, H, dh), k and v (N, Hkv, dh),
    sequence s the rows starts[s] .. starts[s] + lengths[s] (int64); key_bias None or (S, >= T) additive
    per key (a row whose every key is -inf gives NaN; SDPA gives 0). Writes out (N, H, dh) (default:
    a new tensor, never one of the inputs) and returns it; a given out keeps its rows outside every
    sequence. Arguments the C code would misread are refused (ValueError naming them)."""
    lib = library()
    n, heads, dh = q.shape
    if lib is None or not supports(dh, q.dtype, q.device):
        raise ValueError(f"q: no native attention for dh={dh} {q.dtype} on {q.device} here")
    strides = [_rows(t, name) for t, name in ((q, "q"), (k, "k"), (v, "v"))]
    if k.shape != v.shape or k.shape[0] != n or k.shape[2] != dh or heads % k.shape[1]:
        raise ValueError(f"k, v: ({n}, a divisor of {heads}, {dh}) expected, got {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    _spans(starts, lengths, n)
    if key_bias is not None and (key_bias.dim() != 2 or key_bias.shape[0] != len(lengths)
                                 or key_bias.stride(1) != 1
                                 or key_bias.dtype != torch.float32 or key_bias.device.type != "cpu"
                                 or key_bias.shape[1] < max(lengths.tolist(), default=0)):
        raise ValueError(f"key_bias: ({len(lengths)}, >= longest) float32 on the CPU with contiguous keys "
                         f"expected, got {tuple(key_bias.shape)} {key_bias.dtype} on {key_bias.device}")
    out = q.new_empty(q.shape) if out is None else out
    if out.shape != q.shape or any(out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                                   for t in (q, k, v)):
        raise ValueError(f"out: a {tuple(q.shape)} tensor of its own expected, got {tuple(out.shape)}")
    strides.append(_rows(out, "out"))
    args = [x for t, (row, head) in zip((q, k, v, out), strides) for x in (t.data_ptr(), row, head)]
    bias = (None, 0) if key_bias is None else (key_bias.data_ptr(), key_bias.stride(0))
    starts, lengths = starts.contiguous(), lengths.contiguous()
    if lib.attend_rows(*args, starts.data_ptr(), lengths.data_ptr(), len(lengths), *bias, heads, k.shape[1],
                       dh, float(scale), torch.get_num_threads()) != 0:
        raise MemoryError("native attention: no work space")
    return out
