"""EmbedOptions: one embedding request's settings, shared by `lmforge.embed`, `lmforge embed` and the
server's /embed, so the three accept and refuse alike; and the output encodings they name.

dimensions: Matryoshka truncation (Kusupati et al. 2022): the first k coordinates, renormalised.
encoding_format: float; base64 (little-endian float32); int8 / uint8 (each coordinate floored into 256
steps between the calibration's minimum and maximum of that coordinate, read from embedding_ranges.json
beside the model: `calibrate`); binary / ubinary (the sign bits, 1 where a coordinate > 0, packed eight
to a byte, big-endian bit order; binary is the packed byte - 128 as int8, as sentence-transformers does).
prompt / prompt_name: a prefix put before each text, given or named in the model's
config_sentence_transformers.json "prompts" (its default_prompt_name when neither is given).
truncate: false refuses a text longer than the model's limit, true cuts it, "chunk" splits it into
windows of the limit (at most max_chunks) and averages their pooled vectors, weighted by their tokens.
batch_invariant: each text runs through the model alone, so its fp32 vector is bitwise the same whatever
else is in its batch (a batched, unpadded pass differs in the last bits with its neighbours).
"""
from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch

from lmforge.config.model import MAX_LEN, MAX_WIDTH
from lmforge.config.options import OptionsError, check_options, checked_text, option, with_changes
from lmforge.io.files import CheckpointError
from lmforge.utils import jsontext
from lmforge.utils.atomic import atomic_write_text

ENCODINGS = ("float", "base64", "int8", "uint8", "binary", "ubinary")
RANGES_FILE = "embedding_ranges.json"
PROMPTS_FILE = "config_sentence_transformers.json"
MAX_PROMPT_CHARS = 4096
MAX_DIMENSIONS = 4 * MAX_WIDTH  # a pooling may concatenate modes (cls + mean + max ...)
MAX_CHUNKS = 16  # truncate="chunk"'s default bound on a text's windows


@dataclass
class EmbedOptions:
    """How texts become vectors and how the vectors are written."""

    normalize: bool = option(True, "L2-normalise each embedding (after any dimensions cut)")
    dimensions: Optional[int] = option(None, "keep the first this many coordinates (Matryoshka), then "
                                       "renormalise; default all", low=1, high=MAX_DIMENSIONS)
    encoding_format: str = option("float", "float, base64 (float32), int8 / uint8 (calibrated ranges), "
                                  "binary / ubinary (sign bits packed)", choices=ENCODINGS)
    prompt: Optional[str] = option(None, "a prefix put before each text")
    prompt_name: Optional[str] = option(None, "the name of a prompt in the model's "
                                        "config_sentence_transformers.json")
    truncate: Union[bool, str] = option(False, 'a text over the model\'s limit: false refuses it, true cuts '
                                        'it, "chunk" averages its windows')
    max_length: Optional[int] = option(None, "tokens a text may have (its prompt and special tokens "
                                       "included), at most the model's limit", low=1, high=MAX_LEN,
                                       unset="the model's limit")
    max_chunks: Optional[int] = option(None, 'truncate="chunk": windows of one text at most', low=1, high=256,
                                       unset=str(MAX_CHUNKS))
    batch_invariant: bool = option(False, "run each text alone: its vector does not depend on its batch")

    def __post_init__(self) -> None:
        # first: said in its three values, not as its annotation's types ("true or false or a string")
        if self.truncate not in (True, False, "chunk") or not isinstance(self.truncate, (bool, str)):
            got = "null" if self.truncate is None else repr(self.truncate)[:40]
            raise OptionsError(f'truncate must be true, false or "chunk", got {got}', "truncate")
        check_options(self)
        if self.max_chunks is not None and self.truncate != "chunk":  # given, it would be ignored
            raise OptionsError(f'max_chunks={self.max_chunks}: it bounds truncate="chunk"\'s windows, and '
                               f"truncate is {str(self.truncate).lower()}", "max_chunks")
        if self.prompt is not None and len(self.prompt) > MAX_PROMPT_CHARS:
            raise OptionsError(f"prompt has {len(self.prompt)} characters, more than {MAX_PROMPT_CHARS}",
                               "prompt")
        if self.prompt_name is not None and not 0 < len(self.prompt_name) <= 128:
            raise OptionsError("prompt_name must be 1 to 128 characters", "prompt_name")
        for name in ("prompt", "prompt_name"):  # a lone surrogate failed in the tokenizer, naming "text"
            if getattr(self, name) is not None:
                checked_text(getattr(self, name), name)
        if self.prompt is not None and self.prompt_name is not None:
            raise OptionsError("give prompt or prompt_name, not both", "prompt_name")

    def chunk_limit(self) -> int:
        """The windows a text may make under truncate="chunk": max_chunks, or MAX_CHUNKS where not given."""
        return MAX_CHUNKS if self.max_chunks is None else self.max_chunks

    @classmethod
    def build(cls, options: Optional["EmbedOptions"] = None, fields: Optional[dict] = None,
              from_text: bool = False) -> "EmbedOptions":
        """`options` (or the defaults) with the fields that are not None changed; a bad one names the
        field."""
        return with_changes(cls, options, fields, "embed", from_text, drop_none=True)


def read_prompts(path) -> tuple:
    """({name: prefix}, default name or None) of a model directory's config_sentence_transformers.json."""
    file = Path(path) / PROMPTS_FILE if path is not None else None
    if file is None or not file.is_file():
        return {}, None
    try:
        config = jsontext.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {file}: {err}") from None
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise CheckpointError(f"{file}: prompts must map names to texts")
    return prompts, config.get("default_prompt_name")


def prompt_of(options: EmbedOptions, prompts: dict, default: str | None) -> str:
    """The prefix the options ask for ('' for none); an unknown prompt_name names the field."""
    if options.prompt is not None:
        return options.prompt
    name = options.prompt_name or default
    if name is None:
        return ""
    if name not in prompts:
        raise OptionsError(f"prompt_name={name!r} is not one of this model's prompts "
                           f"({', '.join(prompts) or 'it has none'})", "prompt_name")
    return prompts[name]


def cut_dimensions(vectors: torch.Tensor, options: EmbedOptions) -> torch.Tensor:
    """(N, d) -> (N, k): the first `dimensions` coordinates, renormalised when the options normalise."""
    if options.dimensions is None:
        return vectors
    check_dimensions(options, vectors.shape[-1])
    return leading(vectors, options.dimensions, options.normalize)


def check_dimensions(options: EmbedOptions, width: int) -> None:
    """OptionsError naming dimensions where the options ask for more coordinates than the `width` a model's
    embeddings have."""
    if options.dimensions is not None and options.dimensions > width:
        raise OptionsError(f"dimensions={options.dimensions}: this model's embeddings have {width}",
                           "dimensions")


def leading(vectors: torch.Tensor, k: int, normalize: bool) -> torch.Tensor:
    """(N, d) -> (N, min(k, d)): a Matryoshka prefix, L2-normalised again where the similarity is cosine
    (the whole vector too: a prefix of any width compares as a cosine)."""
    cut = vectors[:, :k] if k < vectors.shape[-1] else vectors
    return torch.nn.functional.normalize(cut, p=2, dim=-1) if normalize else cut


def _key(options: EmbedOptions) -> str:
    return f"{options.dimensions or 'all'}/{'normalized' if options.normalize else 'raw'}"


def _ranges_file(file: Path) -> dict:
    """The mapping embedding_ranges.json holds (dimensions key -> ranges); a CheckpointError naming the
    file where it is not JSON or not an object."""
    try:
        kept = jsontext.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {file}: {err}") from None
    if not isinstance(kept, dict):
        raise CheckpointError(f"{file}: expected a JSON object of calibration ranges, got "
                              f"{type(kept).__name__} (delete it and calibrate again: lmforge embed "
                              f"--calibrate --file TEXTS)")
    return kept


def _finite_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)


def read_ranges(path, options: EmbedOptions) -> tuple | None:
    """(minimum, maximum) tensors per coordinate saved for these dimensions and normalisation, or None;
    a CheckpointError naming the file where they are not two lists of finite numbers, minimum <= maximum."""
    file = Path(path) / RANGES_FILE if path is not None else None
    if file is None or not file.is_file():
        return None
    key = _key(options)
    found = _ranges_file(file).get(key)
    if found is None:
        return None
    low, high = (found.get(k) if isinstance(found, dict) else None for k in ("min", "max"))
    if not (_finite_list(low) and _finite_list(high) and len(low) == len(high)
            and all(a <= b for a, b in zip(low, high))):
        raise CheckpointError(f"{file}: {key!r} must hold \"min\" and \"max\", lists of as many finite "
                              f"numbers, each minimum <= its maximum (calibrate again: lmforge embed "
                              "--calibrate --file TEXTS)")
    return torch.tensor(low), torch.tensor(high)


def save_ranges(path, vectors: torch.Tensor, options: EmbedOptions) -> Path:
    """Save the per-coordinate range of calibration `vectors` (already cut as `options` say) into
    path/embedding_ranges.json (atomically), beside the ranges of other dimensions."""
    file = Path(path) / RANGES_FILE
    kept = _ranges_file(file) if file.is_file() else {}
    kept[_key(options)] = {"min": vectors.min(0).values.tolist(), "max": vectors.max(0).values.tolist(),
                           "count": int(vectors.shape[0])}
    return atomic_write_text(file, json.dumps(kept) + "\n")


def quantize(vectors: torch.Tensor, encoding: str, ranges: tuple | None = None) -> torch.Tensor:
    """(N, d) float vectors as `encoding`'s integers: int8 / uint8 (N, d) scaled within `ranges`;
    binary (int8) / ubinary (uint8) (N, ceil(d / 8)) packed sign bits."""
    if encoding in ("binary", "ubinary"):
        bits = (vectors > 0).to(torch.uint8)
        pad = (-bits.shape[1]) % 8
        bytes_ = (bits.shape[1] + pad) // 8  # said, not -1: no rows (no texts) leave -1 undecided
        bits = torch.nn.functional.pad(bits, (0, pad)).view(bits.shape[0], bytes_, 8)
        packed = (bits * torch.tensor([128, 64, 32, 16, 8, 4, 2, 1],
                                      dtype=torch.uint8)).sum(-1, dtype=torch.int32)
        return (packed - 128).to(torch.int8) if encoding == "binary" else packed.to(torch.uint8)
    if ranges is None:
        raise OptionsError(f"encoding_format={encoding} needs the calibration ranges of these dimensions "
                           f"({RANGES_FILE} beside the model: lmforge embed --calibrate --file TEXTS)",
                           "encoding_format")
    low, high = (r.to(vectors.dtype) for r in ranges)
    if low.shape[0] != vectors.shape[1]:
        raise OptionsError(f"encoding_format={encoding}: the calibration has {low.shape[0]} coordinates, the "
                           f"vectors {vectors.shape[1]}", "encoding_format")
    # floored, a constant coordinate stepping by 1: sentence-transformers' quantize_embeddings, code for code
    steps = (high - low) / 255
    steps = torch.where(steps == 0, torch.ones_like(steps), steps)
    scaled = ((vectors - low) / steps).floor().clamp(0, 255)
    return (scaled - 128).to(torch.int8) if encoding == "int8" else scaled.to(torch.uint8)


def encoded(vectors: torch.Tensor, encoding: str, ranges: tuple | None = None) -> list:
    """Each vector as the answer carries it: floats, a base64 text of float32 or a list of integers."""
    if encoding == "float":
        return vectors.tolist()
    if encoding == "base64":
        data = vectors.to(torch.float32).contiguous().numpy().astype("<f4")
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in data]
    return quantize(vectors, encoding, ranges).tolist()
