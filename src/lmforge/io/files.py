"""Files under every format: atomic safetensors writes and strict, named weight loading.

Weights are read only from safetensors (never pickle). Files are written to a
temporary name and renamed, so an interrupted save never leaves a half-written
file behind. Loading is strict: a missing, unexpected or mis-shaped weight is
an error that names it.
"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from lmforge.quant.int8_checks import stored_int8_problem
from lmforge.utils import jsontext
from lmforge.utils.atomic import as_created


class CheckpointError(ValueError):
    """A model directory that cannot be read: missing files, foreign or corrupt contents."""


class DiskFull(OSError):
    """A write that ran out of disk space, reported in one line naming the file."""

    def __init__(self, path, note: str = "") -> None:
        super().__init__(errno.ENOSPC, f"no space left on device writing {path}{note}")
        self.path = path

    def __str__(self) -> str:
        return self.strerror


def out_of_space(err: BaseException, folder) -> bool:
    """Whether a failed write ran out of disk space: ENOSPC from the OS or in a library's message
    (safetensors' Rust writer wraps it), or a disk left all but full (torch's writer reports a
    short write as 'unexpected pos'). Call it before removing the partial file."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if any(s in str(err) for s in ("No space left", "os error 28", "StorageFull")):
        return True
    try:
        return shutil.disk_usage(folder).free < (1 << 20)
    except OSError:
        return False


def save_tensors(tensors: dict, file: Path, metadata: dict) -> None:
    """Write a safetensors file atomically: a temporary file in the same folder, then a rename; a full
    disk is DiskFull, the partial file removed."""
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.")
    os.close(fd)
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp, metadata=metadata)
        as_created(tmp, replacing=file)  # after: the writer makes the file anew
        os.replace(tmp, file)
    except BaseException as err:
        full = isinstance(err, Exception) and out_of_space(err, file.parent)
        Path(tmp).unlink(missing_ok=True)
        if full:
            raise DiskFull(file) from None
        raise


def load_state_strict(model: torch.nn.Module, tensors: dict, source) -> None:
    """Load `tensors` into `model` only if names and shapes fit exactly; name every mismatch."""
    own = model.state_dict()
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    shapes = [f"{k} {tuple(tensors[k].shape)} != {tuple(own[k].shape)}"
              for k in sorted(set(own) & set(tensors)) if tensors[k].shape != own[k].shape]
    problems = [f"missing: {missing}" * bool(missing), f"unexpected: {unexpected}" * bool(unexpected),
                f"wrong shape: {shapes}" * bool(shapes)]
    if any(problems):
        raise CheckpointError(f"weights in {source} do not fit the model: "
                              + "; ".join(p for p in problems if p))
    bad = first_non_finite(tensors)
    if bad is not None:  # NaN weights would load and score nan with nothing said
        raise CheckpointError(f"weights in {source}: {bad} holds non-finite values (NaN or inf)")
    wrong = _wrong_kind(own, tensors)
    if wrong is not None:
        raise CheckpointError(f"weights in {source}: {wrong}")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in tensors.items()}, strict=True)


def _wrong_kind(own: dict, tensors: dict) -> str | None:
    """What a tensor holds that its place in the model cannot take, or None. A float checkpoint loads into
    any float model (fp16, bf16 weights), an integer tensor (int8 weights, ids) only as stored: a cast
    would wrap int8 weights saved as float32 or int32 into other numbers. An int8 layer's weights and
    scales are checked by quant.int8_checks's rule (it knows its buffers: io does not name them)."""
    for k in sorted(own):
        mine, theirs = own[k], tensors[k]
        if mine.dtype != theirs.dtype and not (mine.is_floating_point() and theirs.is_floating_point()):
            return f"{k} is {theirs.dtype}, where the model holds {mine.dtype}"
    return stored_int8_problem(own, tensors)


def first_non_finite(tensors: dict) -> str | None:
    """The name of the first floating-point tensor (by name) holding a NaN or inf; None if all are finite.
    One pass, no copy: a sum per tensor (NaN and inf propagate through it), and the exact check only
    where the sum is not finite (finite weights near the top of the range can overflow it)."""
    for name in sorted(tensors):
        t = tensors[name]
        if t.is_floating_point() and t.numel() and not torch.isfinite(t.sum()):
            if not torch.isfinite(t).all():
                return name
    return None


def safetensors_damage(file) -> str | None:
    """What is wrong with a safetensors file's layout (truncated, not one at all), read from its
    header and size alone; None when the layout is whole."""
    size = os.path.getsize(file)
    with open(file, "rb") as handle:
        head = handle.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        if len(head) < 8 or 8 + n > size:
            return f"truncated: {size} bytes, too few for its header" if n < (100 << 20) else \
                "not a safetensors file (no header)"
        try:
            header = jsontext.loads(handle.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
                      default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "not a safetensors file (its header is not valid)"
    if 8 + n + end > size:
        return f"truncated: {size} of {8 + n + end} bytes"
    return None


def describe_read_error(file, err: Exception) -> str:
    """'cannot read <file>: <cause>' for a weights file that failed to load (the cause from the file's
    layout where it tells more than the library's message)."""
    try:
        cause = safetensors_damage(file) if str(file).endswith(".safetensors") else None
    except OSError as why:  # the OS's reason (permission denied): the library says "No such file" for it
        cause = why.strerror or str(why)
    return f"cannot read {file}: {cause or err}"


def load_weights(model: torch.nn.Module, file: Path) -> None:
    """Load a safetensors file into `model` strictly, naming every mismatch."""
    try:
        tensors = load_file(str(file))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"cannot read weights: {describe_read_error(file, err)}") from None
    load_state_strict(model, tensors, file)
