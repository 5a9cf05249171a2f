"""Training checkpoints: written atomically with checksums, the last k kept, a corrupt one refused.

A checkpoint is a directory `checkpoints/step-NNNNNNN/` holding the trained module's
weights (safetensors), the optimiser and scheduler states (a tensor-only torch file,
read back with weights_only=True), the RNG states and `trainer.json` (step, which is the data
position, config, evaluator state, the sha256 of the two other files, and `state_sha256` over all of
trainer.json's other fields): everything a resume reads is checksummed. It is written under a
temporary name and renamed into place, so a run killed at any moment leaves either the whole
checkpoint or none of it; a full disk removes the partial one and keeps the previous. Nothing
non-finite is written, and a checkpoint is read back only if its files match their checksums and
its weights are finite. One written before the checksums is loaded with a warning saying it is
unverified.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from lmforge.io.files import DiskFull, out_of_space
from lmforge.utils.apart import refuse_writing_over
from lmforge.utils.atomic import UnsafePath, atomic_write_text, file_kind, fsync_dir, refuse_link
from lmforge.utils.checksum import sha256, sign, verify
from lmforge.utils.errors import shown
from lmforge.utils.jsontext import loads

PREFIX = "step-"
FILES = ("model.safetensors", "optimizer.pt")  # checksummed in trainer.json
STATE_KEY = "state_sha256"  # trainer.json's checksum of its own other fields
# the types of trainer.json's fields that a resume reads
INFO_TYPES = {"step": int, "world": int, "stopped": bool, "train": dict, "settings": dict, "model": dict,
              "data": dict}
_KIND_WORDS = {int: "a whole number", bool: "true or false", dict: "a mapping or null"}


class CheckpointCorrupt(ValueError):
    """A checkpoint directory that cannot be read back; names the file and the reason."""


class TrainingDiverged(ValueError):
    """The loss or the weights became NaN or infinite; nothing non-finite was saved."""


class NothingToResume(ValueError):
    """A resume asked for where the output folder holds no checkpoint."""


def rng_states() -> dict:
    """Every RNG the run draws from, as tensors (torch, CUDA, Python, NumPy)."""
    states = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    states["python"] = torch.tensor(list(random.getstate()[1]), dtype=torch.int64)
    _, keys, pos, _, _ = np.random.get_state()
    states["numpy"] = torch.tensor([*keys.tolist(), pos], dtype=torch.int64)
    return states


def seed_all(seed: int) -> None:
    """Seed every global RNG a step may draw from (torch's, Python's, NumPy's) from one seed: nothing a
    step draws, nor the states a checkpoint records, depends on the process (Python and NumPy seed
    themselves from the OS at start)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)


@contextmanager
def global_rngs_kept():
    """Put torch's (and CUDA's), Python's and NumPy's global RNG states back as they were on leaving, by a
    return or a raise: training reseeds them every step (seed_all), which must not change what a caller
    draws after it."""
    states = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


# what every training run writes into its folder, never over an input (a job adds names of its own)
RUN_FILES = ("metrics.jsonl", "loss.png", "checkpoints", "final", "best", "summary.json")


def training_folder(out, **inputs) -> Path:
    """`out`, or UnsafePath naming it where a run cannot write its folder there: an empty name (the working
    folder), a file, or a symbolic link as it, its checkpoints/ or its metrics.jsonl (what a run writes into
    and resumes from, never where a link points; what it replaces whole, final/ or loss.png, may be one), or
    where its RUN_FILES would write over a model or tokenizer folder of `inputs` (utils.apart's refusal)."""
    if not str(out).strip():
        raise UnsafePath("out is empty: name the output folder to write (\"\" is the working folder)")
    out = refuse_link(out)
    if out.exists() and not out.is_dir():
        raise UnsafePath(f"{out}: exists and is not a folder")
    for name in ("checkpoints", "metrics.jsonl"):
        refuse_link(out / name)
    refuse_writing_over(out, *inputs.items(), writes=RUN_FILES, models=tuple(inputs))
    return out


def set_rng_states(states: dict) -> None:
    """Restore what `rng_states` captured."""
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        # a run saved where more devices were visible restores the ones this process sees (each process
        # of a parallel run draws on its own device); set_rng_state_all would fail past the last one
        torch.cuda.set_rng_state_all(list(states["cuda"][: torch.cuda.device_count()]))
    random.setstate((3, tuple(int(x) for x in states["python"]), None))
    keys = states["numpy"].numpy()
    np.random.set_state(("MT19937", keys[:-1].astype(np.uint32), int(keys[-1]), 0, 0.0))


def all_finite(tensors) -> bool:
    """Whether every floating-point tensor holds only finite values. One sum per tensor (NaN and
    inf propagate through it; 5 ms over 22 M parameters where isfinite().all() takes 100) and the
    exact check only if a sum is not finite (finite weights near float range can overflow it).
    FSDP's DTensor shards are checked locally and agreed across ranks."""
    floats = [t.detach() for t in tensors if t.is_floating_point() and t.numel()]
    sharded = any(hasattr(t, "to_local") for t in floats)
    floats = [t.to_local() if hasattr(t, "to_local") else t for t in floats]
    device = floats[0].device if floats else torch.device("cpu")
    # one stack and one host read, not one per tensor (each would wait for the GPU)
    ok = not floats or bool(torch.isfinite(torch.stack([t.sum().float().to(device) for t in floats])).all())
    if not ok:
        ok = all(bool(torch.isfinite(t).all()) for t in floats)
    if sharded and torch.distributed.is_initialized():
        flag = torch.tensor([0.0 if ok else 1.0], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        ok = not bool(flag.item())
    return ok


def _nested_tensors(state) -> list:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in _nested_tensors(v)]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in _nested_tensors(v)]
    return []


def _write_files(tmp: Path, step: int, weights: dict, optimizer: dict, info: dict) -> None:
    """The checkpoint's files under tmp/, trainer.json last with the others' checksums."""
    # tied tensors (a shared embedding) would make safetensors refuse the file: store copies
    save_file({k: v.detach().to("cpu").clone().contiguous() for k, v in weights.items()}, str(tmp / FILES[0]))
    with open(tmp / FILES[1], "wb") as handle:  # a Python file: a full disk raises OSError(ENOSPC)
        torch.save({**optimizer, "rng": rng_states()}, handle)
    # STATE_KEY covers every other field, the files' checksums included: a changed step or option is told
    state = sign({"step": step, **info, "sha256": {name: sha256(tmp / name) for name in FILES}}, STATE_KEY)
    atomic_write_text(tmp / "trainer.json", json.dumps(state, indent=2))
    for file in tmp.iterdir():
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())


def save_checkpoint(root: Path, step: int, weights: dict, optimizer: dict, info: dict,
                    keep_last: int) -> Path:
    """Write checkpoint `step` under root/ atomically and delete all but the newest `keep_last`;
    TrainingDiverged (nothing written) if a weight or optimiser state is not finite, DiskFull (the
    partial checkpoint removed, the previous ones kept) if the disk fills up."""
    if not all_finite(weights.values()) or not all_finite(_nested_tensors(optimizer)):
        raise TrainingDiverged(f"refusing to write checkpoint step {step}: its weights or optimiser "
                               f"state are not finite")
    refuse_link(root).mkdir(parents=True, exist_ok=True)  # a link's target is never written into
    final = root / f"{PREFIX}{step:07d}"
    tmp = root / f".{final.name}.tmp"
    # a save killed at another step (a resume with another save_every never writes that step again)
    # left its partial folder: one run writes here, so every one is debris
    for partial in root.glob(f".{PREFIX}*.tmp"):
        if partial.is_symlink():
            partial.unlink()
        else:
            shutil.rmtree(partial, ignore_errors=True)
    try:
        tmp.mkdir()
        _write_files(tmp, step, weights, optimizer, info)
    except Exception as err:
        full = out_of_space(err, root)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise DiskFull(final) from None
        raise
    if final.is_symlink():  # a link there is replaced, what it points to kept (rmtree refuses a link)
        final.unlink()
    elif final.exists():  # a re-run of the same step replaces it
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(root)
    for old in checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoints(root: Path) -> list:
    """Complete checkpoint directories under root (step-N, N a whole number), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
             and p.name[len(PREFIX):].isdigit() and p.name[len(PREFIX):].isascii()]
    # by number, not name: step 10,000,000 (MAX_STEPS) has 8 digits and sorts as text before step-9999999,
    # so keep_last deleted it and a resume took the older one
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def check_resumable(out) -> None:
    """NothingToResume naming out/checkpoints where it holds no checkpoint (a mistyped --out must not silently
    train afresh), UnsafePath where either is a link; called by jobs before their work, and by Trainer.fit."""
    root = training_folder(out) / "checkpoints"
    if not checkpoints(root):
        raise NothingToResume(f"resume=True (--resume): no checkpoint under {root} (nothing to resume; run "
                              f"without it to start)")


def read_info(path: Path) -> dict:
    """The trainer.json of one checkpoint (a JSON object with a step), or CheckpointCorrupt naming it."""
    try:  # jsontext's loads: JSON nested too deeply is a ValueError too, where json's was a RecursionError
        info = loads((path / "trainer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointCorrupt(f"checkpoint {path}: trainer.json cannot be read ({err})") from None
    if not isinstance(info, dict):
        raise CheckpointCorrupt(f"checkpoint {path}: trainer.json must hold a JSON object {{...}}, not "
                                f"{type(info).__name__} {shown(info)}")
    if "step" not in info:
        raise CheckpointCorrupt(f"checkpoint {path}: trainer.json has no step")
    return info


def _check_fields(path: Path, info: dict) -> None:
    """CheckpointCorrupt naming the field where trainer.json's that a resume reads are not of their types,
    or its step is not its folder's."""
    # one unverified (before the checksums) may hold anything: a wrong type is said here, naming the file,
    # not met mid-resume as int('abc') or 'str' object has no attribute 'items'
    for key in INFO_TYPES:
        if key in info and _unlike(key, info[key]):
            raise CheckpointCorrupt(f"checkpoint {path}: trainer.json's {key} is {shown(info[key])}, not "
                                    f"{_KIND_WORDS[INFO_TYPES[key]]}")
    # checkpoints are ordered (keep_last, the newest resumed) by their folders' numbers: one of another
    # step (a folder renamed, a trainer.json copied in) would be resumed, or deleted, in the wrong place
    number = path.name[len(PREFIX):]
    if path.name.startswith(PREFIX) and number.isascii() and number.isdigit() and int(number) != info["step"]:
        raise CheckpointCorrupt(f"checkpoint {path}: trainer.json is of step {info['step']}, not "
                                f"{int(number)} (a folder renamed or a file copied from another checkpoint)")


def _unlike(key: str, value) -> bool:
    """Whether trainer.json's `value` of `key` is not of its INFO_TYPES type (a count: whole, world >= 1)."""
    kind = INFO_TYPES[key]
    if kind is int:
        return not isinstance(value, int) or isinstance(value, bool) or value < (key == "world")
    # model: None without a config
    return not isinstance(value, kind) and not (kind is dict and value is None)


def check_state(path: Path, info: dict) -> None:
    """CheckpointCorrupt where trainer.json's fields do not match its own checksum (edited or damaged)."""
    # optional: one written before the checksums loads with a warning (_verify_checksums says so)
    verify(info, STATE_KEY, f"checkpoint {path}", error=CheckpointCorrupt, optional=True,
           what="trainer.json does not match its checksum (its step, options or state were changed or "
                "damaged)")


def _verify_checksums(path: Path, info: dict) -> str | None:
    """CheckpointCorrupt on any mismatch; where the checkpoint predates (some of) the checksums, a
    line naming what is unverified; None when everything a resume reads is verified."""
    check_state(path, info)
    sums = info.get("sha256") or {}
    if not isinstance(sums, dict):
        raise CheckpointCorrupt(f"checkpoint {path}: trainer.json's sha256 is not a mapping of checksums")
    for name, want in sums.items():
        try:
            got = sha256(path / name)
        except OSError as err:
            raise CheckpointCorrupt(f"checkpoint {path}: {name} cannot be read ({err})") from None
        if got != want:
            raise CheckpointCorrupt(f"checkpoint {path}: {name} does not match its checksum "
                                    "(changed or damaged)")
    unverified = [name for name in FILES if name not in sums] + ["trainer.json"] * (STATE_KEY not in info)
    # every version that wrote checksums wrote both files' (the state's came later): one without the
    # other's, or a state without them, was edited, not written so
    if (sums or STATE_KEY in info) and any(name not in sums for name in FILES):
        raise CheckpointCorrupt(f"checkpoint {path}: trainer.json lacks the checksum of "
                                f"{', '.join(name for name in FILES if name not in sums)}")
    if unverified:
        return (f"checkpoint {path} was written without checksums for {', '.join(unverified)}: "
                f"loading it unverified")
    return None


def read_checkpoint(path: Path, warn=None) -> tuple:
    """(weights, optimiser state, trainer info) of one checkpoint whose files match their checksums
    and whose weights are finite, or CheckpointCorrupt; warn(line) where it predates the checksums."""
    for name in ("trainer.json", *FILES):  # a FIFO or device there would block the read forever
        if (path / name).exists() and not (path / name).is_file():
            kind = file_kind(path / name)
            raise CheckpointCorrupt(f"checkpoint {path}: {name} is not a regular file ({kind})")
    info = read_info(path)
    note = _verify_checksums(path, info)  # first: an edited field is said as such
    _check_fields(path, info)
    if note and warn is not None:
        warn(f"warning: {note}")
    try:
        weights = load_file(str(path / FILES[0]))
        optimizer = torch.load(path / FILES[1], map_location="cpu", weights_only=True)
    except (OSError, ValueError, SafetensorError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
        raise CheckpointCorrupt(f"checkpoint {path} cannot be read: {err}") from None
    if not all_finite(weights.values()):
        raise CheckpointCorrupt(f"checkpoint {path} holds non-finite weights")
    held = optimizer if isinstance(optimizer, dict) else {}
    lacks = [k for k in ("optimizer", "scheduler", "rng") if k not in held]
    if lacks:  # an unverified (pre-checksum) file of another kind: one line, not a KeyError mid-resume
        raise CheckpointCorrupt(f"checkpoint {path}: {FILES[1]} holds no {lacks[0]} state")
    schedule = optimizer["scheduler"]  # LambdaLR's state: its step count at least (unverified: anything)
    if not isinstance(schedule, dict) or type(schedule.get("last_epoch")) is not int:
        raise CheckpointCorrupt(f"checkpoint {path}: {FILES[1]}'s scheduler state holds no step count")
    _check_rng(path, optimizer["rng"])
    return weights, optimizer, info


def _check_rng(path: Path, states) -> None:
    """CheckpointCorrupt where the RNG states (unverified: pre-checksum) cannot be set: tried and undone here,
    not met as a traceback once the weights are loaded."""
    try:
        with global_rngs_kept():
            set_rng_states(states)
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
        raise CheckpointCorrupt(f"checkpoint {path}: {FILES[1]}'s RNG states cannot be set "
                                f"({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None


def latest_checkpoint(root: Path, warn=print):
    """The newest usable checkpoint (path, weights, optimiser, info), skipping corrupt ones with a
    warning; None if there is no checkpoint; CheckpointCorrupt if there are some but none is usable
    (a resume must not silently start over on top of them)."""
    found, newest = checkpoints(root), None
    for left, path in reversed(list(enumerate(found))):  # left: how many older ones remain
        try:
            return (path, *read_checkpoint(path, warn))
        except CheckpointCorrupt as err:  # say a fall-back only where there is one to fall back to
            then = "falling back to the previous checkpoint" if left else "no older one to fall back to"
            warn(f"warning: {err}; {then}")
            newest = newest or err
    if found:  # the error names what is wrong with the newest: the warnings may go where the error does not
        raise CheckpointCorrupt(f"no usable checkpoint in {root} ({len(found)} damaged; the newest: "
                                f"{newest}); refusing to start over on top of them: move them away or choose "
                                f"another out (--out)")
    return None
