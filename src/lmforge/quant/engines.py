"""The int8 products behind quant/int8.py's quantising kernels.

- "fbgemm", "onednn": torch.ops.quantized.linear_dynamic on the engine's packed weight. The op finds
  its input's range and quantises it itself, by one range for the whole tensor (Int8Linear divides
  each row by its peak first, so its rows are quantised alike);
- "onednn-u8": lmforge quantises each row itself (quant/native.py: one pass over the input, where
  the above take four), and oneDNN multiplies the bytes (onednn.qlinear_pointwise). The same
  u8 x s8 product, per-row ranges without the division into a buffer. all-MiniLM-L6-v2 at 32 x 128
  with AVX2 code: 1.59x fp32 -> 1.76x (bench/FINDINGS.md);
- "w8a32" (both modes, at few rows): the int8 weight widened to fp32 in registers against fp32 input
  (quant/native.py), read as tiles packed once. No activation is quantised: for decoding, where the
  time is the weight bytes read;
- "u8-vnni" (dynamic, at few rows, on a CPU with AVX-512 VNNI): rows quantised as for "onednn-u8",
  multiplied by lmforge's own VNNI kernel (quant/csrc/vnni.c) on tiles packed once: a text's 14 rows of
  MiniLM's shapes in 11-25 us a product, quantisation included, where oneDNN's dynamic product takes
  31-65 (bench/FINDINGS.md, "A VNNI kernel for a few rows").
"""
from __future__ import annotations

import functools
import threading
import warnings
from dataclasses import dataclass

import torch

from lmforge.quant import native
from lmforge.quant.isa import cpu_fields

ENGINES = ("fbgemm", "onednn")  # kernels that are quantized engines: linear_dynamic on their packed weight
U8 = "onednn-u8"  # the kernel fed with bytes lmforge quantised per row
W8A32 = "w8a32"  # the native weight-only product (int8 weights, fp32 activations)
VNNI = "u8-vnni"  # the native u8 x s8 product at a few rows (bytes quantised per row, as for U8)
QUANTISING = (*ENGINES, U8, VNNI)  # the kernels that quantise activations (the others read them in fp32)
_ENGINE = threading.Lock()  # held while the process-wide quantized engine is switched to pack a weight


@functools.cache
def engine_usable(engine: str) -> bool:
    """Whether this torch build packs weights for the quantized engine (asked once per process)."""
    return pack_weight(engine, torch.ones(1, 16, dtype=torch.int8), torch.ones(1)) is not None


def pack_weight(engine: str, q: torch.Tensor, scale: torch.Tensor):
    """The quantized engine's ("fbgemm", "onednn") packed form of an int8 per-channel weight (no bias:
    it is added after the row scales), or None where this torch lacks the engine or refuses it.
    The engine is chosen at packing time; linear_dynamic follows the packed form's."""
    if engine not in torch.backends.quantized.supported_engines:
        return None
    with _ENGINE:  # the engine is process-wide: two threads packing for two engines would cross
        before = torch.backends.quantized.engine
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the qint8 tensor the prepack reads is marked deprecated
                torch.backends.quantized.engine = engine
                zeros = torch.zeros(q.shape[0], dtype=torch.long)
                qw = torch._make_per_channel_quantized_tensor(q.cpu(), scale.cpu().double(), zeros, 0)
                return torch.ops.quantized.linear_prepack(qw, None)
        except (AttributeError, RuntimeError):
            return None
        finally:
            torch.backends.quantized.engine = before


@dataclass(frozen=True)
class U8Weight:
    """A layer's weight as "onednn-u8" reads it: oneDNN's packed int8, its (out,) fp32 scales and zero
    points, and 1 / s for a smoothed layer's input (None unsmoothed)."""

    packed: torch.Tensor
    scale: torch.Tensor
    zero_points: torch.Tensor
    inverse_smooth: torch.Tensor | None

    def multiply(self, q: torch.Tensor, bits: int) -> torch.Tensor:
        """(rows, in) bytes quantised per row to `bits` (zero point levels + 1, step 1 / levels) -> (rows,
        out) fp32 (q - zp) / levels W^T, multiplied in oneDNN."""
        steps = levels(bits)
        return torch.ops.onednn.qlinear_pointwise(q, 1.0 / steps, steps + 1, self.packed, self.scale,
                                                  self.zero_points, None, 1.0, 0, torch.float32, "none", [],
                                                  "")

    def product(self, x: torch.Tensor, bits: int) -> tuple:
        """(rows, in) fp32 -> ((rows, out) (x / peak) W^T, (rows, 1) peak): _row_product through oneDNN."""
        return _row_product(self, x, bits)


def pack_u8(q: torch.Tensor, scale: torch.Tensor, smooth: torch.Tensor | None) -> U8Weight:
    """The U8Weight of an int8 per-channel weight (q (out, in), scale (out,))."""
    inverse = None if smooth is None else torch.reciprocal(smooth.float()).contiguous()
    return U8Weight(torch.ops.onednn.qlinear_prepack(q.contiguous(), None), scale.float().contiguous(),
                    torch.zeros(q.shape[0], dtype=torch.long), inverse)


@functools.cache
def u8_usable() -> bool:
    """Whether "onednn-u8" runs here: the native kernel built and loaded, oneDNN's int8 ops in this
    torch, and a small product through them right (asked once per process)."""
    if native.library() is None or not hasattr(torch.ops.onednn, "qlinear_pointwise"):
        return False
    try:
        q = torch.tensor([[1, -2, 3, 4] * 4, [5, 6, -7, 8] * 4], dtype=torch.int8)
        x = torch.linspace(-1, 1, 3 * 16).view(3, 16)
        with torch.no_grad():
            out, peak = pack_u8(q, torch.ones(2), None).product(x, 7)
        return bool(torch.allclose(out * peak, x @ q.float().T, rtol=0.05, atol=0.1))
    except (AttributeError, RuntimeError):
        return False


def _row_product(weight, x: torch.Tensor, bits: int) -> tuple:
    """(rows, in) fp32 -> ((rows, out) (x / peak) W^T, (rows, 1) peak) on a row-quantised weight form
    (U8Weight: "onednn-u8", VnniWeight: "u8-vnni"): each row (divided by the smoothing factors where the
    layer has them) quantised to `bits` (7: [1, 127], 8: [1, 255]) by its own peak, then weight.multiply;
    the caller multiplies each output row by its peak (with the bias, in one pass)."""
    q, peak = native.quantise_rows(x, weight.inverse_smooth, levels(bits), levels(bits) + 1)
    return weight.multiply(q, bits), peak


def levels(bits: int) -> int:
    """The steps either side of the zero point (levels + 1) of `bits`-bit activations: 63 or 127."""
    return (1 << (bits - 1)) - 1


def usable(kernel: str) -> bool:
    """Whether this build and machine run the op behind `kernel` (an engine's, onednn-u8's, w8a32's, each
    asked once per process); the other kernels are plain torch calls, checked by the layer."""
    check = _CHECKS.get(kernel)
    return check is None or check(kernel)


def pack_w8a32(q: torch.Tensor, scale: torch.Tensor) -> native.Int8Tiles:
    """The form "w8a32" reads of an int8 per-channel weight (q (out, in), scale (out,)): its tiles."""
    return native.Int8Tiles(q, scale)


@functools.cache
def w8a32_usable() -> bool:
    """Whether "w8a32" runs here: the native library built and loaded, and a small product through it
    right (asked once per process)."""
    if native.library() is None:
        return False
    q = torch.tensor([[1, -2, 3, 4] * 4, [5, 6, -7, 8] * 4, [-1, 0, 1, 2] * 4], dtype=torch.int8)
    x, scale, bias = torch.linspace(-1, 1, 2 * 16).view(2, 16), torch.tensor([0.5, 2.0, 1.0]), torch.ones(3)
    out = pack_w8a32(q, scale)(x, bias)
    return bool(torch.allclose(out, x @ (q.float() * scale[:, None]).T + bias, rtol=1e-5, atol=1e-5))


@dataclass(frozen=True)
class VnniWeight:
    """A layer's weight as "u8-vnni" reads it: its tiles and scales, and 1 / s for a smoothed layer's
    input (None unsmoothed)."""

    tiles: native.VnniTiles
    inverse_smooth: torch.Tensor | None

    def multiply(self, q: torch.Tensor, bits: int) -> torch.Tensor:
        """U8Weight.multiply's contract, by lmforge's VNNI kernel on the tiles."""
        return self.tiles(q, levels(bits))

    def product(self, x: torch.Tensor, bits: int) -> tuple:
        """(rows, in) fp32 -> ((rows, out) (x / peak) W^T, (rows, 1) peak): _row_product on the tiles."""
        return _row_product(self, x, bits)


def pack_vnni(q: torch.Tensor, scale: torch.Tensor, smooth: torch.Tensor | None) -> VnniWeight:
    """The VnniWeight of an int8 per-channel weight (q (out, in), scale (out,))."""
    inverse = None if smooth is None else torch.reciprocal(smooth.float()).contiguous()
    return VnniWeight(native.VnniTiles(q.contiguous(), scale.float().contiguous()), inverse)


@functools.cache
def vnni_usable() -> bool:
    """Whether "u8-vnni" runs here: the native library built with u8_vnni, a CPU with AVX-512 VNNI and
    torch's AVX-512 code in use (an ATEN_CPU_CAPABILITY cap to AVX2 holds lmforge's code to it too), and
    a small product through it right (asked once per process)."""
    lib = native.library()
    if lib is None or not hasattr(lib, "u8_vnni") or "avx512_vnni" not in cpu_fields()["flags"].split() \
            or torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    q = torch.tensor([[1, -2, 3, 4] * 4, [5, 6, -7, 8] * 4, [-1, 0, 1, 2] * 4], dtype=torch.int8)
    x = torch.linspace(-1, 1, 2 * 16).view(2, 16)
    out, peak = pack_vnni(q, torch.tensor([0.5, 2.0, 1.0]), None).product(x, 8)
    want = x @ (q.float() * torch.tensor([0.5, 2.0, 1.0])[:, None]).T
    return bool(torch.allclose(out * peak, want, rtol=0.02, atol=0.05))


_CHECKS = {"fbgemm": engine_usable, "onednn": engine_usable, U8: lambda _: u8_usable(),
           W8A32: lambda _: w8a32_usable(), VNNI: lambda _: vnni_usable()}  # usable's: kernel -> its check
