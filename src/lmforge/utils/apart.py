"""The one refusal of an output that would write over an input, for a job called from Python (its field
"out") and for the command line (its flag --out) alike: one rule (utils.atomic.writes_over), one typed error
(UnsafePath, whose field is the output's name) and one wording, naming the output and the input."""
from __future__ import annotations

import os
from pathlib import Path

from lmforge.utils.atomic import UnsafePath, writes_over
from lmforge.utils.model_folder import inside_job_folder

# what writing the output would do to the input, by how the two meet (writes_over's answer); "lies inside"
# a folder other than a model's: every file of it is read, so the output would be read back as an input
WHY = {"is": "the job would write over it",
       "holds": "the job would write over it, or keep it among the files it writes",
       "lies inside": "every file of that folder is read, so the output would be read back as an input "
                      "(by a later run)"}
# "lies inside" a model (or tokenizer) folder: only its model files are read, and the output is one of them
WHY_MODEL = "the job would write over a file it reads from that model folder"


def refuse_writing_over(out, *inputs, writes: tuple = (), models: tuple = (), holds: tuple | bool = (),
                        name: str = "out") -> None:
    """UnsafePath (field `name`: "out" for a job, "--out" or another flag for the command line) where
    writing the output `out` (a file, or a folder the names `writes` go into) would write over one of
    `inputs`, (name, given) pairs, by utils.atomic.writes_over on resolved paths (links, ../ and hard links
    seen through). given: a path, a list of paths, a model (the folder it was loaded from), or nothing on
    disk (None, a preset's name, an object). `models`: the names of model or tokenizer folders, read by
    their model files alone (inside_job_folder), where any other folder is read whole; `holds`: the names of
    inputs the output may not hold at all (a source model; True: every input)."""
    if out is None:
        return
    target = Path(out).resolve()
    for field, given in inputs:
        for source in on_disk(given):
            resolved = Path(source).resolve()
            model = inside_job_folder(resolved) if field in models else None  # where its model files lie
            relation = writes_over(resolved, target, writes, model, holding=holds is True or field in holds)
            if relation:
                why = WHY_MODEL if relation == "lies inside" and model is not None else WHY[relation]
                raise UnsafePath(f"{name} {out} {relation} the input {field} {source}: {why}; "
                                 f"choose another {name}", name)


def on_disk(given) -> list:
    """The paths `given` names that are on disk: a path or a list of them, or a model loaded from a folder
    (that folder); an empty name, a missing file, a preset's name or another object: none."""
    given = getattr(given, "loaded_from", given)
    paths = [given] if isinstance(given, (str, os.PathLike)) else given if isinstance(given, (list, tuple)) \
        else []
    return [path for path in paths
            if isinstance(path, (str, os.PathLike)) and str(path).strip() and Path(path).exists()]
