"""A loaded model's recommended generation settings, the one start of every face.

`lmforge.load(DIR)` reads a directory's generation_config.json (else config.json's decoding keys) once,
checks it as GenerationOptions checks a request, says the settings lmforge does not apply, and keeps it on
the model as `model.generation_config` (a Recommendation; None where the directory recommends nothing or
the model was built in Python), as the reference library keeps its GenerationConfig on the model.
`lmforge.generate`, `lmforge generate` and the server's generation routes all build their options with
`resolve`: the request's values over the checkpoint's, over the defaults, so one request gives the same
tokens in each face. A max_length and a min_length count the positions before the new tokens, so they
become new-token counts only when a request's prompt is known (`for_start`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from lmforge.config.options import OptionsError, from_dict
from lmforge.generate.options import (FIELD_NAMES, FILE, FORCED, OFF, GenerationOptions, for_start,
                                     read_recommended, replaced_minimums, write_settings)
from lmforge.io.files import CheckpointError

@dataclass(frozen=True)
class Recommendation:
    """The generation settings a model directory recommends, as written (checked when read)."""

    path: str
    fields: dict

    def for_start(self, start: int, given=()) -> dict:
        """The GenerationOptions fields recommended for `start` positions before the new tokens (`given`: the
        names a request sets itself, which the recommendation need not serve)."""
        return for_start(self.path, self.fields, start, given)


def read(path) -> Optional[Recommendation]:
    """The Recommendation of model directory `path`, checked as a request's settings are (an OptionsError
    naming the file and the field); None where it recommends nothing."""
    fields = read_recommended(path)
    try:
        from_dict(GenerationOptions, {k: v for k, v in fields.items() if k in FIELD_NAMES}, FILE)
    except OptionsError as err:
        raise OptionsError(f"{Path(path) / FILE}: {err}", err.field) from None
    return Recommendation(str(path), fields) if fields else None


def attach(model, path) -> None:
    """Keep `path`'s recommendation on `model` (lmforge.io calls this once a directory is loaded); one that
    fails its check is kept as its error, raised when a face generates: a model loaded to embed or fine-tune
    is not refused for settings it never uses. An encoder generates nothing, so it recommends nothing (an
    exported one would otherwise gain a generation_config.json of the reference's default top_k)."""
    if model.config.architecture == "encoder":
        model.generation_config = None
        return
    try:
        found = read(path)
    except (OptionsError, CheckpointError) as err:
        model.generation_config = err
        return
    if found is None:
        model.generation_config = None
        return
    # a forced id the model config already holds (a converter put the file's there) is the config's to say,
    # so that changing the config changes it; one the config does not hold (a native model's OFF) stays
    config = {k: _or_off(getattr(model.config, k)) for k in FORCED}
    fields = {k: v for k, v in found.fields.items() if k not in config or v != config[k]}
    model.generation_config = Recommendation(found.path, fields) if fields else None


def _or_off(token):
    """A config's forced id as a recommendation spells it: None (no forced token) is OFF."""
    return OFF if token is None else token


def keep(model, path) -> None:
    """Write `model`'s recommendation into the directory it was saved to (lmforge.io calls this once a model
    is saved): saved, it recommends what it did. The model config's forced ids go beneath it, since where
    the file exists the reference reads them from it alone."""
    found = recommendation(model)
    if found is not None:
        cfg = getattr(model, "_orig_mod", model).config
        write_settings(path, {**{k: _or_off(getattr(cfg, k)) for k in FORCED}, **found.fields})


def recommendation(model) -> Optional[Recommendation]:
    """The Recommendation `model` was loaded with (torch.compile's wrapper: its model's), or None; the
    error of one that failed its check when it was read."""
    found = getattr(getattr(model, "_orig_mod", model), "generation_config", None)
    if isinstance(found, (OptionsError, CheckpointError)):
        raise found
    return found if isinstance(found, Recommendation) else None


def resolve(model, start: int, given: Optional[dict] = None, options: Optional[GenerationOptions] = None,
            defaults: Optional[dict] = None) -> GenerationOptions:
    """The options of one request: `given` (the values the caller set) over `options` where one is passed
    whole, else over the model's recommendation for `start`, over `defaults` (a face's own, where neither
    states one), over GenerationOptions' defaults. A minimum given replaces the other one beneath it, as in
    the reference. A recommendation that does not fit the request is refused naming the file."""
    given = dict(given or {})
    if options is not None:
        return GenerationOptions.build(options, given)
    found = recommendation(model)
    stated = found.for_start(start, given) if found is not None else {}
    fields = {**{k: v for k, v in (defaults or {}).items() if k not in stated}, **stated}
    for name in replaced_minimums(given):
        fields.pop(name, None)
    try:
        return GenerationOptions.build(None, {**fields, **given})
    except OptionsError as err:
        if found is None or err.field in given or err.field not in stated:
            raise
        raise OptionsError(f"{err} ({err.field} as {Path(found.path) / FILE} recommends it: give "
                           f"{err.field} to override it)", err.field) from None
