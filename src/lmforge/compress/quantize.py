"""int8 quantisation of every Linear of a model's backbone and heads, for CPU inference.

Weights are quantised symmetrically per output channel (one fp32 scale a row, int8 values in
[-127, 127]); in "dynamic" mode activations are quantised at run time (per row, from its
range), in "weight-only" mode they are not (fp32; bf16 inside the int8pack-bf16 kernel). Before
dynamic quantisation the Linears that read a LayerNorm are smoothed (SmoothQuant, compress/smooth.py):
its outlier channels are moved into their weights, calibrated on text or random tokens. The
layers are lmforge's own Int8Linear (quant/int8.py), which runs whichever kernel this machine
measured fastest for each shape, fp32 included, so a quantised layer is never slower than its fp32
form. Not the deprecated torch.ao.quantization.quantize_dynamic.

The token table becomes int8 too (per row) where no LM head projects with it (an encoder's:
half of all-MiniLM-L6-v2's weights). What stays fp32: position and segment embeddings, norms,
a token table that a tied LM head reads, and an untied LM head's vocabulary
projection, which generate reads as a weight matrix (its own input-major / screened ways,
generate/vocab/projection.py); a tied one is the token table. The config records the mode and
what was kept, so `lmforge.load` rebuilds the int8 layers and the safetensors file holds int8
weights + scales; training such a model, or exporting it to the Hugging Face format, is refused.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from lmforge.compress.quantize_options import QuantizeOptions
from lmforge.compress.smooth import ALPHA, random_batches, smoothing
from lmforge.config.options import OptionsError, coerce
from lmforge.heads import LMHead
from lmforge.model import Transformer
from lmforge.quant.int8 import MODES, Int8Linear, int8_linears, swap_linears
from lmforge.quant.int8_embedding import Int8Embedding, swap_tokens

SCHEME = "int8 symmetric, per output channel"


def kept_fp32(model: nn.Module) -> list:
    """Names of the Linears quantisation leaves in fp32: the vocabulary projection of an LM head."""
    return [f"{name}.decoder" for name, m in model.named_modules()
            if isinstance(m, LMHead) and isinstance(m.decoder, nn.Linear)]


def quantize(model: Transformer, mode: str = "dynamic", inplace: bool = False, alpha: float | None = ALPHA,
             calibration: list | None = None, source: str | None = None, seed: int = 0) -> Transformer:
    """The model with every Linear (but `kept_fp32`) an Int8Linear of `mode`; a copy unless inplace.
    Dynamic mode smooths the Linears that read a LayerNorm (compress/smooth.py) with strength
    `alpha` (None: not), from the calibration batches (smooth.text_batches; None: random tokens
    drawn from `seed`), recorded as coming from `source` ("text", ...). mode, alpha and seed are checked by
    QuantizeOptions, as `lmforge quantize`'s flags are (OptionsError naming the argument)."""
    given = {"mode": mode, "alpha": alpha, "seed": seed}  # checked as the command's flags are
    checked = QuantizeOptions(**{k: coerce(QuantizeOptions, k, v, from_text=False) for k, v in given.items()})
    mode, alpha, seed = checked.mode, checked.alpha, checked.seed  # np.int64(1) -> 1, as Python's other faces
    tokens = _quantisable(model, mode, alpha, calibration)
    model = model if inplace else copy.deepcopy(model)
    kept = kept_fp32(model)
    per_layer = {}  # Linear name -> its smoothing factors
    if mode == "dynamic" and alpha is not None:  # measured on the fp32 model, before any layer is swapped
        per_layer = smoothing(model, calibration or random_batches(model, seed), alpha=alpha)
    swapped = swap_linears(model, mode, kept, smooth=per_layer)
    if not swapped:
        raise ValueError("the model has no Linear layers to quantise")
    if tokens:
        swap_tokens(model)
    record = {"mode": mode, "scheme": SCHEME, "kept_fp32": kept, "tokens": tokens}
    smoothed = sorted(set(per_layer) & set(swapped))
    if smoothed:
        origin = source or ("random tokens" if calibration is None else "batches given")
        record["smoothing"] = {"alpha": alpha, "calibration": origin, "layers": smoothed}
    model.config = model.config.replace(quantization=record)
    return model.eval()


def _quantisable(model, mode: str, alpha, calibration) -> bool:
    """Whether the token table is quantised too (not where a tied LM head reads it), after a ValueError or
    OptionsError for a model or calibration `quantize` cannot take, raised before any layer is swapped."""
    if not isinstance(getattr(model, "_orig_mod", model), Transformer):  # torch.compile's wraps one
        raise OptionsError(f"model must be a model (lmforge.load(DIR) reads one), got {type(model).__name__}",
                           "model")
    _check_batches(calibration)
    if model.config.quantization:
        raise ValueError(f"the model is already int8-quantised ({model.config.quantization['mode']})")
    if model.config.architecture == "elmo":
        raise ValueError("ELMo (a biLSTM) has no Transformer Linears to quantise this way")
    if calibration is not None and (mode != "dynamic" or alpha is None):
        raise OptionsError("calibration batches serve smoothing: dynamic mode with an alpha only",
                           "calibration")
    tokens = not any(isinstance(m, LMHead) for m in model.modules())  # a tied head reads model.tokens.weight
    if tokens and not bool(torch.isfinite(model.tokens.weight).all()):  # in place, the model stays whole
        raise ValueError("tokens.weight holds non-finite values (NaN or inf), which int8 cannot hold")
    return tokens


def _check_batches(calibration) -> None:
    """An OptionsError naming calibration unless it is None or a non-empty list of batches, each a dict of the
    model's keyword arguments (smooth.text_batches makes them of texts): [] would calibrate on random tokens,
    recorded as batches given."""
    if calibration is None:
        return
    if not isinstance(calibration, (list, tuple)):
        shown = type(calibration).__name__
    elif not calibration:
        shown = "an empty list"
    else:
        odd = next((b for b in calibration if not isinstance(b, dict)), None)
        if odd is None:
            return
        shown = f"a list holding {type(odd).__name__}"
    raise OptionsError(f"calibration must be a list of batches (dicts of the model's inputs; "
                       f"compress.smooth.text_batches(model, tokenizer, texts) makes them), got {shown}",
                       "calibration")


def _backbone(name: str) -> bool:
    return not name.startswith("heads.")  # as Transformer.num_parameters: the heads are not counted


def _int8_modules(model: nn.Module) -> list:
    return [m for name, m in model.named_modules()
            if isinstance(m, (Int8Linear, Int8Embedding)) and _backbone(name)]


COUNTED = "backbone weights, heads excluded (as lmforge inspect, prune and distill count them)"


def parameter_count(model: nn.Module) -> int:
    """Weights of the backbone (COUNTED: the heads excluded, as Transformer.num_parameters), int8 ones
    included (int8 layers hold buffers, not parameters): one per weight and bias, not the scales."""
    found = _int8_modules(model)
    int8 = sum(m.qweight.numel() + (m.bias.numel() if getattr(m, "bias", None) is not None else 0)
               for m in found)
    return sum(p.numel() for name, p in model.named_parameters() if _backbone(name)) + int8


def int8_share(model: nn.Module) -> float:
    """Share of the backbone's weights (parameter_count) stored as int8."""
    return sum(m.qweight.numel() for m in _int8_modules(model)) / max(parameter_count(model), 1)


def int8_layers(model: nn.Module) -> int:
    """Number of Int8Linear layers."""
    return len(int8_linears(model))


__all__ = ["COUNTED", "Int8Linear", "MODES", "SCHEME", "int8_layers", "int8_share", "kept_fp32",
           "parameter_count", "quantize"]
