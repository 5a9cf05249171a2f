"""What code the CPU kernel libraries run here: the CPU's flags and the ISA caps in the environment.

int8's activation width follows it (quant/int8.py), and so does the machine digest under which int8
kernel choices are kept (quant/kernel_store.py).
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform

import torch

ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS",
            "MKL_ENABLE_INSTRUCTIONS")  # settings that cap the code torch's kernel libraries run


CPU_FIELDS = ("model name", "flags", "Features", "CPU implementer", "CPU part", "CPU variant")  # x86, ARM


def parse_cpuinfo(text: str) -> dict:
    """The first value of each of CPU_FIELDS in /proc/cpuinfo's text ("" where absent)."""
    found = dict.fromkeys(CPU_FIELDS, "")
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in found and not found[name.strip()]:
            found[name.strip()] = value.strip()
    return found


@functools.cache
def cpu_fields() -> dict:
    """This machine's parse_cpuinfo (the model name from platform where there is no /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return {**dict.fromkeys(CPU_FIELDS, ""), "model name": platform.processor()}


# what lets the kernel libraries use VNNI (u8 x s8 summed straight into int32): the CPU's flags, and no
# cap to older code (ONEDNN_MAX_CPU_ISA=AVX2, FBGEMM_ENABLE_INSTRUCTIONS=AVX2 emulate an AVX2 CPU)
VNNI_FLAGS = ("avx512_vnni", "amx_int8")
# the capped values that keep VNNI (AVX2_VNNI does not: it needs the avx_vnni flag besides; AVX512_CORE
# is AVX-512 before VNNI); oneDNN reads its cap as ONEDNN_ or DNNL_MAX_CPU_ISA
ONEDNN_KEEPS = ("AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10",
                "DEFAULT", "ALL")
VNNI_CAPS = {"ONEDNN_MAX_CPU_ISA": ONEDNN_KEEPS, "DNNL_MAX_CPU_ISA": ONEDNN_KEEPS,
             "FBGEMM_ENABLE_INSTRUCTIONS": ("AVX512_E1",)}


def vnni_in_use(flags: str, environ) -> bool:
    """Whether fbgemm and oneDNN run their VNNI code, given /proc/cpuinfo's flags and the environment."""
    if not any(flag in flags.split() for flag in VNNI_FLAGS):
        return False
    caps = {name: environ.get(name, "").strip().upper() for name in VNNI_CAPS}
    return all(not cap or any(ok in cap for ok in VNNI_CAPS[name]) for name, cap in caps.items())


@functools.cache
def eight_bit_activations() -> bool:
    """Whether dynamic int8 quantises activations to 8 bits (VNNI in use: no int16 pair sums to
    saturate) rather than 7; read once per process."""
    return vnni_in_use(cpu_fields()["flags"], os.environ)


def activation_bits() -> int:
    """The bits dynamic int8 quantises activations to here: 8 or 7 (eight_bit_activations)."""
    return 8 if eight_bit_activations() else 7


def machine() -> str:
    """A digest of what decides the kernels' speed and rounding here: the CPU model and flags, the ISA
    caps set in the environment, the torch version."""
    caps = [f"{name}={os.environ.get(name, '')}" for name in ISA_CAPS]
    text = "\n".join([platform.machine(), *cpu_fields().values(), *caps, torch.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:16]
