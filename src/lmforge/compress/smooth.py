"""SmoothQuant (Xiao et al. 2023): activation outliers moved into the weights before dynamic int8.

A LayerNorm's output has a few channels far larger than the rest (BERT's outlier dimensions,
Kovaleva et al. 2021). Dynamic int8 quantises each row by its largest |x|, so those channels set
the step and the others keep a handful of levels (7-bit activations, where VNNI is missing, lose
most). For a Linear y = W x, any positive s per input channel gives y = (W diag(s)) (x / s);
SmoothQuant's s_j = max|x_j|^alpha / max_i |W_ij|^(1 - alpha) evens the channels' ranges between
activation and weight (the paper's default alpha is 0.5; 0.75 measured better here, see ALPHA).
The maxima of x come from calibration batches run through the fp32 model: text, or without any,
random tokens, since the outlier channels belong to the LayerNorm, not to the input (all-MiniLM-L6-v2:
0.9934 lowest cosine calibrated on random tokens, 0.9954 on text). quant/int8.Int8Linear divides its
input by s before quantising it, at no measured cost (one more pass over x: 255 ms a 32 x 128 batch
either way).
"""
from __future__ import annotations

import torch
from torch import nn

from lmforge.utils.modes import evaluating

# migration strength: the share of an outlier's range moved into the weight. all-MiniLM-L6-v2, lowest
# embedding cosine to fp32 over 512 GCIDE definitions with 7-bit activations: 0.9862 unsmoothed,
# alpha 0.5 0.9938, 0.75 0.9954, 0.85 0.9955, 1.0 0.9949 (8-bit: 0.9916, -, 0.9979, 0.9982, 0.9969)
ALPHA = 0.75
CALIBRATION_ROWS, CALIBRATION_LENGTH = 64, 128  # random-token calibration: 8192 positions
CALIBRATION_TEXTS = 512  # text calibration: SmoothQuant's calibration set size
TOKEN_CHARS = 128  # no vocabulary's token spans more characters (WordPiece: 100 make one [UNK]; serve/limits)
BATCH = 32  # calibration rows a forward
FLOOR = 1e-5  # channel maxima below this count as not reached (a channel that never fired)
# a factor stays within SPREAD of the layer's median: a column whose factor is far below the rest would
# round to a few int8 levels (or none) of its row, and a channel quiet in calibration may fire later.
# all-MiniLM-L6-v2's factors span 0.49-6.5x their median (dequantised weight error 0.76 -> 0.9-1.9 %)
SPREAD = 16.0
# the Linears (by their attribute name in layers/) that read a LayerNorm's output
READERS = ("qkv", "q", "kv", "global_qkv", "up", "gate")


@torch.no_grad()
def input_ranges(model: nn.Module, batches, names) -> dict:
    """{name: (in,) max |x_j| over every row the named nn.Linears read} while the model runs the
    calibration batches (each a dict of the model's keyword arguments). The model is switched to
    eval mode and hooked meanwhile: not for a model another thread is running."""
    wanted = set(names)
    ranges, hooks = {}, []

    def record(name):
        def hook(module, args):
            rows = args[0].detach().reshape(-1, module.in_features).float()
            peak = rows.abs().amax(dim=0)
            ranges[name] = peak if name not in ranges else torch.maximum(ranges[name], peak)
        return hook

    for name, module in model.named_modules():
        if name in wanted and isinstance(module, nn.Linear):
            hooks.append(module.register_forward_pre_hook(record(name)))
    device = next(model.parameters()).device  # batches are built on the CPU
    try:
        with evaluating(model):
            for batch in batches:
                model(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
    finally:
        for hook in hooks:
            hook.remove()
    return ranges


def check_alpha(alpha: float) -> None:
    """A ValueError unless alpha is a migration strength in [0, 1]."""
    if not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha!r}: the migration strength is a number in [0, 1]")


def factors(x_max: torch.Tensor, weight: torch.Tensor, alpha: float = ALPHA) -> torch.Tensor:
    """(in,) SmoothQuant's s for an (out, in) weight whose input reached x_max per channel: within
    SPREAD of their median, and the median where the channel (or its weight column) never reached FLOOR."""
    check_alpha(alpha)
    x_max, w_max = x_max.float(), weight.detach().abs().amax(dim=0).float()
    reached = (x_max >= FLOOR) & (w_max >= FLOOR)
    s = x_max.clamp(min=FLOOR).pow(alpha) / w_max.clamp(min=FLOOR).pow(1.0 - alpha)
    middle = s[reached].median() if bool(reached.any()) else s.new_tensor(1.0)
    s = torch.where(reached, s, middle)
    return torch.minimum(torch.maximum(s, middle / SPREAD), middle * SPREAD)


def layer_norm_readers(model: nn.Module) -> list:
    """Names of the Linears that read a LayerNorm's output, where the outlier channels are: the
    fused q k v projection and the FFN's first layer (SmoothQuant's choice in a Transformer block)."""
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in READERS]


def smoothing(model: nn.Module, batches, names=None, alpha: float = ALPHA) -> dict:
    """{name: (in,) s} for the named Linears (default: layer_norm_readers) from calibration batches;
    a layer the batches never reached gets none."""
    names = layer_norm_readers(model) if names is None else list(names)
    ranges = input_ranges(model, batches, names)
    modules = dict(model.named_modules())
    return {name: factors(ranges[name], modules[name].weight, alpha) for name in names if name in ranges}


def random_tokens(model: nn.Module, rows: int, length: int, seed: int = 0) -> tuple:
    """(rows, T) token ids drawn from the vocabulary (past the first 1000 where it is large: no
    special tokens), T = length or the model's longest, and an all-ones mask."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    low = 1000 if vocab > 2000 else 0
    ids = torch.randint(low, vocab, (rows, min(length, model.config.max_seq_len)), generator=g)
    return ids, torch.ones_like(ids)


def as_batch(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """The keyword arguments one calibration forward takes: an encoder-decoder reads ids on both sides."""
    batch = {"input_ids": ids, "attention_mask": mask, "run_heads": False}
    if model.config.architecture == "encoder-decoder":
        batch["decoder_input_ids"] = ids
    return batch


def text_batches(model: nn.Module, tokenizer, texts: list, max_length: int = CALIBRATION_LENGTH) -> list:
    """Calibration batches of `texts`, tokenised as the model reads them; similar lengths share a batch,
    so little padding (whose rows the maxima would count too) goes through. Each text is read as far as
    its first `limit` tokens can reach (TOKEN_CHARS a token): a 15 MB line was tokenised whole
    (3 GB, 15 s) for its first 128 tokens."""
    limit = min(max_length, model.config.max_seq_len)
    texts = sorted((text[:limit * TOKEN_CHARS] for text in texts), key=len)
    out = []
    for start in range(0, len(texts), BATCH):
        encoded = tokenizer.encode_batch(texts[start:start + BATCH], max_length=limit)
        out.append(as_batch(model, encoded.input_ids, encoded.attention_mask))
    return out


def random_batches(model: nn.Module, seed: int = 0) -> list:
    """Data-free calibration: CALIBRATION_ROWS rows of random tokens, BATCH a forward."""
    ids, mask = random_tokens(model, CALIBRATION_ROWS, CALIBRATION_LENGTH, seed)
    return [as_batch(model, i, m) for i, m in zip(ids.split(BATCH), mask.split(BATCH))]
