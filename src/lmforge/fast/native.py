"""lmforge's one piece of native code, fast/csrc/rowquant.c (per-row activation quantisation for
int8's "onednn-u8" kernel, fast/engines.py): built with the system's gcc on first use, then kept.

Kept per source, flags and compiler in $LMFORGE_NATIVE (a folder) or $XDG_CACHE_HOME/lmforge/native
(~/.cache by default); LMFORGE_NATIVE=off: never built nor loaded. It is built only where it can share
torch's OpenMP runtime (Linux, torch's libgomp loaded, gcc: clang's -fopenmp would bring a second
runtime), for the code torch itself runs here (its CPU capability: AVX2 code where
ATEN_CPU_CAPABILITY=avx2 caps it; never -march=native). Elsewhere (not Linux, torch without libgomp),
the kernel is no candidate and int8 runs its other kernels, as measured; so too where gcc is missing,
the build fails, or the library's libgomp is not torch's (a wheel's renamed copy): said once on
standard error.
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

from lmforge.atomic import as_created
from lmforge.fast.kernel_store import cached_place

ENV = "LMFORGE_NATIVE"
SOURCE = Path(__file__).with_name("csrc") / "rowquant.c"
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


@functools.cache
def library():
    """The loaded library (ctypes), or None where it is switched off, cannot share torch's OpenMP
    runtime, or does not build (said once)."""
    where, before = folder(), _gomp_files()
    if where is None or sys.platform != "linux" or not before:
        return None
    try:
        gcc = shutil.which("gcc")
        if gcc is None:
            raise OSError("no gcc on PATH")
        lib = ctypes.CDLL(str(_built(gcc, where)))
        added = _gomp_files() - before  # torch's libgomp has another soname (a renamed copy in its wheel):
        if added:  # the library brought its own (other libraries' copies, scikit-learn's, are not its)
            raise OSError(f"it would run a second OpenMP runtime beside torch's: {sorted(added)}")
    except (OSError, subprocess.SubprocessError) as err:
        print(f"lmforge: {SOURCE.name} not built ({err}); int8 runs without its kernel ({ENV}: the folder "
              "it is kept in, or off)", file=sys.stderr)
        return None
    lib.quantise_rows.argtypes = [_POINTER, ctypes.c_long, ctypes.c_long, _POINTER, ctypes.c_float,
                                  ctypes.c_int, _POINTER, _POINTER, ctypes.c_int]
    lib.quantise_rows.restype = None
    return lib


def _built(gcc: str, where: Path) -> Path:
    """The library for this source, flags and compiler: built now (into a temporary name, then renamed:
    processes building together each get a whole file) unless kept from before."""
    flags = FLAGS + isa_flags()
    version = subprocess.run([gcc, "--version"], check=False, capture_output=True, text=True,
                             timeout=60).stdout.splitlines()[:1]
    digest = hashlib.sha256(SOURCE.read_bytes() + repr((flags, version)).encode()).hexdigest()
    path = where / f"rowquant-{digest[:16]}.so"
    if path.is_file():
        return path
    where.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=where, prefix=".rowquant-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run([gcc, *flags, str(SOURCE), "-o", tmp], check=False, capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            raise OSError(f"gcc: {(done.stderr.strip().splitlines() or ['failed'])[0]}")
        as_created(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def quantise_rows(x: torch.Tensor, inv: torch.Tensor | None, levels: int, zp: int) -> tuple:
    """(rows, cols) fp32 -> ((rows, cols) uint8 q, (rows, 1) fp32 peak): each row (times inv, (cols,),
    where given) mapped onto [zp - levels, zp + levels] by its largest |value|; a non-finite row's peak
    is non-finite. Needs library(); an input the C code would misread is refused (ValueError)."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"{SOURCE.name} is not loaded here (native.library() is None)")
    x, inv = _checked(x, inv, levels, zp)
    rows, cols = x.shape
    q, peak = torch.empty((rows, cols), dtype=torch.uint8), torch.empty((rows, 1))
    lib.quantise_rows(x.data_ptr(), rows, cols, None if inv is None else inv.data_ptr(),
                      float(levels), int(zp), q.data_ptr(), peak.data_ptr(), torch.get_num_threads())
    return q, peak


def _checked(x: torch.Tensor, inv: torch.Tensor | None, levels: int, zp: int) -> tuple:
    """x and inv as the C code reads them (contiguous), or ValueError naming what does not fit: it reads
    raw fp32 memory, so another dtype, device or length would be read wrong or past its end."""
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"x: a 2-D float32 CPU tensor expected, got {x.dim()}-D {x.dtype} on {x.device}")
    if inv is not None and (tuple(inv.shape) != (x.shape[1],) or inv.dtype != torch.float32
                            or inv.device.type != "cpu"):
        raise ValueError(f"inv: ({x.shape[1]},) float32 CPU expected, got {tuple(inv.shape)} {inv.dtype} "
                         f"on {inv.device}")
    if not 1 <= levels <= 127 or not levels <= zp <= 255 - levels:
        raise ValueError(f"levels {levels}, zp {zp}: 1 <= levels <= 127 and levels <= zp <= 255 - levels")
    return x.contiguous(), None if inv is None else inv.contiguous()
