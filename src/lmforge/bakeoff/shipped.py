"""The plans shipped with lmforge (bakeoff/plans/NAME.yaml), and the file a --plan names."""
from __future__ import annotations

from pathlib import Path

SHIPPED = Path(__file__).resolve().parent / "plans"


def shipped_plans() -> tuple:
    """The names of the plans shipped with lmforge (bakeoff/plans/NAME.yaml)."""
    return tuple(sorted(p.stem for p in SHIPPED.glob("*.yaml")))


def plan_file(name) -> Path:
    """The file a --plan names: a YAML or JSON file, else a shipped plan's (electra, roberta, ...)."""
    path = Path(name)
    if not path.is_file() and (SHIPPED / f"{path}.yaml").is_file():
        return SHIPPED / f"{path}.yaml"
    return path
