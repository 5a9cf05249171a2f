"""What a stored int8 layer may hold: the rules lmforge.io checks an int8 checkpoint by on load.

quant/int8.py's quantise_per_channel writes weights in [-127, 127] (symmetric: -128 is never made) and
positive per-row scales (max|w| / 127, or 1 for a zero row). A file holding anything else is foreign
or damaged: a scale of 0 or below zeroes or flips a row, a -128 scales it past its max|w|, a smoothing
factor of 0 or below makes inf or flips an input channel (compress/smooth.py makes them positive). The
buffer names (`qweight` beside `scale`, and `smooth`: Int8Linear's, Int8Embedding's) are known here, not
in io.
"""
from __future__ import annotations

import torch


def valid_scales(scale: torch.Tensor) -> bool:
    """Whether per-row scales are ones quantise_per_channel makes: positive (max|w| / 127, or 1 for a zero
    row), so that a loaded layer's weight is never flipped or zeroed (lmforge.io checks them on load)."""
    return bool((scale > 0).all())


def valid_qweight(q: torch.Tensor) -> bool:
    """Whether int8 weights are ones quantise_per_channel makes: within [-127, 127] (symmetric). -128 is
    never written: a stored one is a foreign or damaged file, whose row would be scaled past max|w|."""
    return q.numel() == 0 or int(q.min()) >= -127


def stored_int8_problem(own: dict, tensors: dict) -> str | None:
    """What an int8 layer's stored buffers (`qweight` beside `scale`, and `smooth`) hold that quantisation
    never makes, naming the tensor, or None; `own` is the model's state dict, `tensors` the file's, of the
    model's names and dtypes (lmforge.io checks them on load)."""
    for k in sorted(own):
        if k.rpartition(".")[2] != "qweight" or own[k].dtype != torch.int8:
            continue
        scale = k[:-len("qweight")] + "scale"
        if tensors[k].dtype == torch.int8 and not valid_qweight(tensors[k]):
            return f"{k} holds -128, outside the [-127, 127] int8 weights are quantised to"
        if scale in own and not valid_scales(tensors[scale]):
            return f"{scale} holds a scale that is not positive"
        smooth = k[:-len("qweight")] + "smooth"  # SmoothQuant's s (compress/smooth.py): x / s meets W s
        if smooth in own and not bool((tensors[smooth] > 0).all()):
            return f"{smooth} holds a smoothing factor that is not positive"
    return None
