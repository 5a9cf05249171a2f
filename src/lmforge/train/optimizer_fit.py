"""Whether a checkpoint's optimiser state fits the run that resumes it: loading an optimiser's state is not
strict (a parameter that never had a gradient has no state), so a changed set of trained parameters, other
groups or another group lr would otherwise load in part, unsaid."""
from __future__ import annotations

from pathlib import Path

import torch

from lmforge.train.checkpoint import FILES


def optimizer_change(saved, now: dict, shapes: dict) -> str | None:
    """How a checkpoint's optimiser state (dist.optimizer_state's form: parameter names per group) differs
    from the run's fresh optimiser `now`: other groups, other trainable parameters, another group lr (a
    changed freeze_* or layer_decay), or a state tensor not of its parameter's shape (`shapes`, from the
    checkpoint's weights); None where it fits. Loading is not strict (a parameter that never had a
    gradient has no state), so without this a changed set of trained parameters would load in part."""
    groups, state = (saved.get("param_groups"), saved.get("state")) if isinstance(saved, dict) else ((), ())
    if not isinstance(groups, list) or not isinstance(state, dict) or \
            not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        return "it holds no optimiser state of parameter groups"
    if len(groups) != len(now["param_groups"]):
        return f"{len(groups)} parameter groups (the run's) vs {len(now['param_groups'])} (now)"
    for i, (old, new) in enumerate(zip(groups, now["param_groups"])):
        for what, names in (("trained by the run, not now", set(old["params"]) - set(new["params"])),
                            ("trained now, not by the run", set(new["params"]) - set(old["params"]))):
            if names:
                return f"{len(names)} parameters {what} (e.g. {min(names)})"
        if old.get("initial_lr") != new.get("initial_lr"):
            return (f"parameter group {i}: lr {old.get('initial_lr')!r} (the run's) vs "
                    f"{new.get('initial_lr')!r} (now)")
    named = {name for g in groups for name in g["params"]}
    for name, entry in state.items():
        if name not in named or not isinstance(entry, dict):
            return f"a state for {name}, which is no parameter the run trains"
        bad = [k for k, t in entry.items() if isinstance(t, torch.Tensor) and t.dim()
               and tuple(t.shape) != shapes.get(name)]
        if bad:
            return f"{name}'s {bad[0]} of shape {tuple(entry[bad[0]].shape)}, not its {shapes.get(name)}"
    return None


def check_optimizer(path: Path, saved, now: dict, weights: dict) -> None:
    """ValueError naming the checkpoint where its optimiser state does not fit the run's fresh
    optimiser `now` (optimizer_change; `weights` the checkpoint's, for the parameters' shapes)."""
    change = optimizer_change(saved, now, {k: tuple(v.shape) for k, v in weights.items()})
    if change:
        raise ValueError(f"cannot resume {path}: its {FILES[1]} does not fit this run's optimiser "
                         f"({change}); resume with the run's settings (freeze_*, layer_decay ...) or "
                         f"choose another out (--out)")
