"""lmforge's native code, quant/csrc/ (rowquant.c: per-row activation quantisation for int8's
"onednn-u8" kernel, and of a feed-forward layer's hidden units as they are made, quant/int8_ffn.py;
w8a32.c: the weight-only "w8a32" product; vnni.c: the "u8-vnni" product at a few rows; all called from
quant/engines.py): one library, built with
the system's gcc on first use, then kept. `load` builds and loads any such library the same way
(fast/native_attention.py's attention kernel is another).

Kept per source, flags and compiler in $LMFORGE_NATIVE (a folder) or $XDG_CACHE_HOME/lmforge/native
(~/.cache by default); LMFORGE_NATIVE=off: never built nor loaded. It is built only where it can share
torch's OpenMP runtime (Linux, torch's libgomp loaded, gcc: clang's -fopenmp would bring a second
runtime), for the code torch itself runs here (its CPU capability: AVX2 code where
ATEN_CPU_CAPABILITY=avx2 caps it; never -march=native). Elsewhere (not Linux, torch without libgomp),
the kernels are no candidates: int8 runs its other kernels, as measured, and attention SDPA; so too
where gcc is missing, the build fails, or the library's libgomp is not torch's (a wheel's renamed
copy): said once on standard error.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from lmforge.quant.kernel_store import cached_place
from lmforge.utils.atomic import as_created

ENV = "LMFORGE_NATIVE"
SOURCES = tuple(Path(__file__).with_name("csrc") / name for name in ("rowquant.c", "w8a32.c", "vnni.c"))
NAME = "lmforge-native"  # the library's file: NAME-<digest of sources, flags, compiler>.so
# no -ffast-math: the C is written to vectorise without it, and NaN must stay NaN
FLAGS = ("-O3", "-std=c11", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", "-fno-trapping-math",
         "-fno-math-errno")
ISA_FLAGS = {"AVX512": ("-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"),
             "AVX2": ("-mavx2", "-mfma")}  # torch's CPU capability -> the code gcc may emit
_POINTER = ctypes.c_void_p


def folder() -> Path | None:
    """Where built libraries are kept, or None where LMFORGE_NATIVE=off."""
    return cached_place(ENV, "native")


def isa_flags() -> tuple:
    """gcc's flags for the vector code torch runs on this machine (none beyond the baseline elsewhere)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ()
    return ISA_FLAGS.get(torch.backends.cpu.get_cpu_capability(), ())


def _gomp_files() -> set:
    """The libgomp files mapped into this process: torch's OpenMP runtime where it is libgomp (the one
    gcc's -fopenmp links); one more after loading the library: it did not share torch's."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            return {line.split(maxsplit=5)[-1].strip() for line in f if "libgomp" in line}
    except OSError:
        return set()


def load(name: str, sources: tuple, without: str):
    """The library `name` built from `sources` and loaded (ctypes), or None where it is switched off,
    cannot share torch's OpenMP runtime, or does not build: said on standard error with `without`, what
    runs instead (callers cache the answer, so it is said once)."""
    where, before = folder(), _gomp_files()
    if where is None or sys.platform != "linux" or not before:
        return None
    try:
        gcc = shutil.which("gcc")
        if gcc is None:
            raise OSError("no gcc on PATH")
        lib = ctypes.CDLL(str(_built(gcc, where, name, sources)))
        added = _gomp_files() - before  # torch's libgomp has another soname (a renamed copy in its wheel):
        if added:  # the library brought its own (other libraries' copies, scikit-learn's, are not its)
            raise OSError(f"it would run a second OpenMP runtime beside torch's: {sorted(added)}")
    except (OSError, subprocess.SubprocessError) as err:
        print(f"lmforge: {name} not built ({err}); {without} ({ENV}: the folder it is kept in, or off)",
              file=sys.stderr)
        return None
    return lib


@functools.cache
def library():
    """The loaded int8 library (ctypes), or None where `load` gives none."""
    lib = load(NAME, SOURCES, "int8 runs without its native kernels")
    if lib is None:
        return None
    lib.quantise_rows.argtypes = [_POINTER, ctypes.c_long, ctypes.c_long, _POINTER, ctypes.c_float,
                                  ctypes.c_int, _POINTER, _POINTER, ctypes.c_int]
    lib.quantise_rows.restype = None
    lib.act_quantise_rows.argtypes = [_POINTER, ctypes.c_long, ctypes.c_long, _POINTER, _POINTER,
                                      ctypes.c_int, _POINTER, ctypes.c_float, ctypes.c_int, _POINTER,
                                      _POINTER, ctypes.c_int]
    lib.act_quantise_rows.restype = None
    lib.w8a32.argtypes = [_POINTER, _POINTER, _POINTER, _POINTER, ctypes.c_long, ctypes.c_long, ctypes.c_long,
                          _POINTER, ctypes.c_int]
    lib.w8a32.restype = None
    if hasattr(lib, "u8_vnni"):  # x86-64 only (vnni.c), and run only where the CPU has VNNI (VnniTiles)
        lib.u8_vnni.argtypes = [_POINTER, _POINTER, _POINTER, _POINTER, ctypes.c_long, ctypes.c_long,
                                ctypes.c_long, ctypes.c_int, ctypes.c_float, _POINTER, ctypes.c_int]
        lib.u8_vnni.restype = None
    return lib


def _built(gcc: str, where: Path, name: str, sources: tuple) -> Path:
    """The library for these sources, flags and compiler: built now (into a temporary name, then renamed:
    processes building together each get a whole file) unless kept from before."""
    flags = FLAGS + isa_flags()
    version = _version(gcc)
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in sources) + repr((flags, version)).encode())
    path = where / f"{name}-{digest.hexdigest()[:16]}.so"
    if path.is_file():
        return path
    where.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=where, prefix=f".{name}-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run([gcc, *flags, *map(str, sources), "-o", tmp], check=False, capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            said = done.stderr.strip().splitlines() or ["failed"]  # the first error, not "In function ..."
            raise OSError(f"gcc: {next((line for line in said if 'error' in line), said[0])}")
        as_created(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


@functools.cache
def _version(gcc: str) -> list:
    """gcc's first `--version` line, asked once a process (every library's digest holds it)."""
    return subprocess.run([gcc, "--version"], check=False, capture_output=True, text=True,
                          timeout=60).stdout.splitlines()[:1]


def _loaded():
    """library(), or RuntimeError where it is not loaded here."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"{NAME} is not loaded here (native.library() is None)")
    return lib


def quantise_rows(x: torch.Tensor, inv: torch.Tensor | None, levels: int, zp: int) -> tuple:
    """(rows, cols) fp32 -> ((rows, cols) uint8 q, (rows, 1) fp32 peak): each row (times inv, (cols,),
    where given) mapped onto [zp - levels, zp + levels] by its largest |value|; a non-finite row's peak
    is non-finite. Needs library(); an input the C code would misread is refused (ValueError)."""
    lib = _loaded()
    x, inv = _checked(x, inv, levels, zp)
    rows, cols = x.shape
    q, peak = torch.empty((rows, cols), dtype=torch.uint8), torch.empty((rows, 1), dtype=torch.float32)
    lib.quantise_rows(x.data_ptr(), rows, cols, None if inv is None else inv.data_ptr(),
                      float(levels), int(zp), q.data_ptr(), peak.data_ptr(), torch.get_num_threads())
    return q, peak


ACTIVATIONS = ("none", "relu", "gelu")  # act_quantise_rows's act, by its code in rowquant.c


def act_quantise_rows(acc: torch.Tensor, rowscale: torch.Tensor, bias: torch.Tensor | None, act: str,
                      inv: torch.Tensor | None, levels: int, zp: int) -> tuple:
    """quantise_rows(act(acc * rowscale + bias) (* inv)) in one pass (rowquant.c): an int8 FFN's hidden
    units from its up product acc (rows, cols), rowscale (rows, 1) and bias (cols,) or None, quantised for
    the down product; act one of ACTIVATIONS (GELU within 2e-7 |v|). Needs library(); an argument the C
    code would misread is refused (ValueError naming it)."""
    lib = _loaded()
    if act not in ACTIVATIONS:
        raise ValueError(f"act: one of {', '.join(ACTIVATIONS)} expected, got {act!r}")
    acc, inv = _checked(acc, inv, levels, zp, "acc")
    rows, cols = acc.shape
    _check("rowscale", rowscale, (rows, 1))
    if bias is not None:
        _check("bias", bias, (cols,))
    rowscale, bias = rowscale.contiguous(), None if bias is None else bias.contiguous()
    q, peak = torch.empty((rows, cols), dtype=torch.uint8), torch.empty((rows, 1), dtype=torch.float32)
    b, i = (None if t is None else t.data_ptr() for t in (bias, inv))
    lib.act_quantise_rows(acc.data_ptr(), rows, cols, rowscale.data_ptr(), b, ACTIVATIONS.index(act), i,
                          float(levels), int(zp), q.data_ptr(), peak.data_ptr(), torch.get_num_threads())
    return q, peak


def _checked(x: torch.Tensor, inv: torch.Tensor | None, levels: int, zp: int, name: str = "x") -> tuple:
    """x and inv as the C code reads them (contiguous), or ValueError naming what does not fit: it reads
    raw fp32 memory, so another dtype, device or length would be read wrong or past its end."""
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"{name}: a 2-D float32 CPU tensor expected, got {x.dim()}-D {x.dtype} on "
                         f"{x.device}")
    if inv is not None:
        _check("inv", inv, (x.shape[1],))
    if not 1 <= levels <= 127 or not levels <= zp <= 255 - levels:
        raise ValueError(f"levels {levels}, zp {zp}: 1 <= levels <= 127 and levels <= zp <= 255 - levels")
    return x.contiguous(), None if inv is None else inv.contiguous()


TILE = 64  # output channels side by side in w8a32's weight tiles (w8a32.c's TILE)


class Int8Tiles:
    """An (out, in) int8 weight and its (out,) fp32 scales as quant/csrc/w8a32.c reads them: tiles of TILE
    channels side by side, t[b, i, j] = q[b TILE + j, i] (zero past the last channel). Calling it on
    (rows, in) fp32 x gives (rows, out) fp32 (x q^T) * scale + bias, the int8 weights widened to fp32 in
    registers. Needs library(); arguments the C code would misread are refused (ValueError naming the
    argument): the weight once here, x and bias at each call."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        _loaded()
        if q.dim() != 2 or q.dtype != torch.int8 or q.device.type != "cpu":
            raise ValueError(f"q: a 2-D int8 CPU tensor expected, got {q.dim()}-D {q.dtype} on {q.device}")
        self.out, self.cols = q.shape
        _check("scale", scale, (self.out,))
        self.tiles = _padded_rows(q, TILE).view(-1, TILE, self.cols).transpose(1, 2).contiguous()
        self.scale = scale.contiguous()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """(rows, in) fp32 -> (rows, out) fp32."""
        if x.dim() != 2 or x.shape[1] != self.cols or x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"x: (rows, {self.cols}) float32 on the CPU expected, got {tuple(x.shape)} "
                             f"{x.dtype} on {x.device}")
        if bias is not None:
            _check("bias", bias, (self.out,))
            bias = bias.contiguous()
        x, y = x.contiguous(), torch.empty((x.shape[0], self.out), dtype=torch.float32)
        b = None if bias is None else bias.data_ptr()
        library().w8a32(self.tiles.data_ptr(), self.scale.data_ptr(), b, x.data_ptr(), x.shape[0], self.cols,
                        self.out, y.data_ptr(), torch.get_num_threads())
        return y


LANES = 16  # output channels side by side in u8_vnni's weight tiles (vnni.c's LANES)
VNNI_MAX_IN = 1 << 16  # inputs a u8_vnni sum may hold: 255 x 127 x 2^16 stays inside int32


def vnni_fits(inputs: int) -> bool:
    """Whether u8_vnni takes a weight of `inputs` inputs: a multiple of 4, at most VNNI_MAX_IN."""
    return inputs % 4 == 0 and 0 < inputs <= VNNI_MAX_IN


class VnniTiles:
    """An (out, in) int8 weight and its (out,) fp32 scales as quant/csrc/vnni.c reads them: tiles of LANES
    channels with 4 consecutive inputs each, t[b, g, j, k] = q[b LANES + j, 4 g + k], and each channel's
    sum of weights. Calling it on (rows, in) uint8 bytes (quantised per row around zp, `levels` steps
    either side) gives (rows, out) fp32 ((x - zp) / levels) q^T * scale. Needs library() with u8_vnni and a
    CPU with AVX-512 VNNI (quant/engines.py checks); arguments the C code would misread are refused
    (ValueError naming them)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        if not hasattr(_loaded(), "u8_vnni"):
            raise RuntimeError(f"{NAME} has no u8_vnni here (not an x86-64 build)")
        if q.dim() != 2 or q.dtype != torch.int8 or q.device.type != "cpu" or not vnni_fits(q.shape[1]):
            raise ValueError(f"q: a 2-D int8 CPU tensor of a positive multiple of 4 inputs (at most "
                             f"{VNNI_MAX_IN}) expected, got {tuple(q.shape)} {q.dtype} on {q.device}")
        self.out, self.cols = q.shape
        _check("scale", scale, (self.out,))
        self.tiles = _padded_rows(q, LANES).view(-1, LANES, self.cols // 4, 4).transpose(1, 2).contiguous()
        self.sums = q.sum(1, dtype=torch.int32).contiguous()
        self.scale = scale.contiguous()

    def __call__(self, x: torch.Tensor, levels: int) -> torch.Tensor:
        """(rows, in) uint8, zero point levels + 1 -> (rows, out) fp32."""
        if x.dim() != 2 or x.shape[1] != self.cols or x.dtype != torch.uint8 or x.device.type != "cpu":
            raise ValueError(f"x: (rows, {self.cols}) uint8 on the CPU expected, got {tuple(x.shape)} "
                             f"{x.dtype} on {x.device}")
        if not 1 <= levels <= 127:
            raise ValueError(f"levels: 1..127 expected, got {levels}")
        x, y = x.contiguous(), torch.empty((x.shape[0], self.out), dtype=torch.float32)
        library().u8_vnni(self.tiles.data_ptr(), self.sums.data_ptr(), self.scale.data_ptr(), x.data_ptr(),
                          x.shape[0], self.cols, self.out, levels + 1, 1.0 / levels, y.data_ptr(),
                          torch.get_num_threads())
        return y


def _padded_rows(q: torch.Tensor, multiple: int) -> torch.Tensor:
    """q (out, in) with zero rows after it up to a multiple of `multiple` rows: whole weight tiles."""
    padded = torch.zeros((-(-q.shape[0] // multiple) * multiple, q.shape[1]), dtype=q.dtype)
    padded[:q.shape[0]] = q
    return padded


def _check(name: str, t: torch.Tensor, shape: tuple) -> None:
    if tuple(t.shape) != shape or t.dtype != torch.float32 or t.device.type != "cpu":
        raise ValueError(f"{name}: {shape} float32 on the CPU expected, got {tuple(t.shape)} {t.dtype} on "
                         f"{t.device}")
