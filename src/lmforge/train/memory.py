"""Whether one training step fits in the memory at hand, judged before the first one runs.

A micro-batch's cost is the client's choice (batch_size, the sequences' length), and a step that does
not fit is not an error Python sees: Linux's out-of-memory killer ends the process (signal 9, no
message) after it has taken every page, the machine's other work with it. So the trainer draws its
first micro-batch, estimates the step's peak from its shape and the model's sizes, and refuses (a
ValueError naming batch_size) where that is more than the device has free.

The estimate follows the usual count of what backpropagation keeps (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", sec. 4.1), in fp32: per token and layer
16 d_model + 3 d_ff + 3 heads x T floats (the layer's input alone under activation checkpointing, and
one layer whole); the logits, their softmax and gradient; the trained weights' gradients and Adam's two
moments (the weights themselves are in memory already). Its coefficients were set above what the
process's peak grew by per token on this CPU (bert-tiny: 3,050 floats a token and layer against 4,352
counted; bert-base: 21,100 against 26,112), so a step it refuses would not have fitted; memory_check=false
runs one anyway.
"""
from __future__ import annotations

import torch

from lmforge.config.memory import meminfo

FLOAT = 4  # bytes: training runs in fp32 (bf16 autocast keeps fp32 weights and many fp32 activations)


def step_bytes(cfg, shape: tuple, checkpointing: bool = False, parameters: int = 0) -> int:
    """Estimated peak bytes one fp32 training step adds to a model of config `cfg` (its weights are in memory
    already) on a micro-batch of `shape` (rows, tokens): activations of every layer, the logits and their
    gradient, and the gradients and Adam's two moments of the `parameters` trained."""
    rows, tokens = shape
    n = rows * tokens
    layer = 16 * cfg.d_model + 3 * cfg.d_ff + 3 * cfg.n_heads * tokens
    layers = cfg.n_layers + (cfg.decoder_layers if cfg.architecture == "encoder-decoder" else 0)
    kept = cfg.d_model * layers + layer if checkpointing else layer * layers
    return FLOAT * (n * (kept + 3 * cfg.vocab_size) + 3 * parameters)


def free_bytes(device: torch.device) -> int | None:
    """Bytes the device has free now (CPU: the kernel's MemAvailable), or None where that is unknown."""
    if device.type == "cuda":  # what the driver has free, and what torch holds but does not use
        return torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) \
            - torch.cuda.memory_allocated(device)
    # a step's activations are needed now, beside what other processes hold: MemAvailable, not MemTotal
    return meminfo("MemAvailable") if device.type == "cpu" else None


def longest_example(data) -> int:
    """The most input_ids of an example of `data` where it is a list of them (fine-tuning's records, of
    every length); 0 for anything else (a corpus's shards hold examples of one length)."""
    if not isinstance(data, list):
        return 0
    return max((len(e["input_ids"]) for e in data if isinstance(e, dict) and "input_ids" in e), default=0)


def check_step_fits(model, batch: dict, device: torch.device, checkpointing: bool = False,
                    longest: int = 0) -> None:
    """A ValueError naming batch_size where one training step on `batch` (a collated micro-batch) would
    need more memory than `device` has free, its rows as long as the `longest` example where that is
    longer (a later batch holding it is padded to it); nothing for a model without a Transformer's config."""
    cfg, ids = getattr(model, "config", None), batch.get("input_ids")
    if not all(hasattr(cfg, k) for k in ("d_model", "d_ff", "n_heads", "n_layers", "vocab_size")) \
            or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return
    free = free_bytes(device)
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    rows, tokens = ids.shape[0], max(ids.shape[1], min(longest, cfg.max_seq_len))
    need = step_bytes(cfg, (rows, tokens), checkpointing, parameters)
    if free is not None and need > free:
        raise ValueError(f"batch_size={rows}: a micro-batch of {rows} x {tokens} tokens needs about "
                         f"{need / 2**30:.1f} GiB to train, more than the {free / 2**30:.1f} GiB free on "
                         f"{device.type}; lower batch_size (accumulation keeps the global batch)"
                         + ("" if checkpointing else ", set checkpointing=true")
                         + " or, to run it anyway, memory_check=false")
