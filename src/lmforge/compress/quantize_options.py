"""The options of an int8 quantisation (`lmforge quantize`, `compress.quantize`): one declaration that the
command's flags, the job (compress/quantize_report.py) and the Python call (compress/quantize.py) all check
against, so that they accept and refuse alike."""
from __future__ import annotations

from dataclasses import dataclass

from lmforge.compress.smooth import ALPHA
from lmforge.config.model import MAX_LEN
from lmforge.config.options import MAX_SEED, OptionsError, check_options, option
from lmforge.quant.int8 import MODES

SEQ_LEN = 128  # tokens a row of the timed batch unless told (the model's longest where shorter)
# what a client may have timed (each round runs the fp32 and the int8 model once): a batch of at most
# 512 rows of 128 tokens, and at most 2^20 tokens over the rounds (bert-base: a few minutes on 2 cores)
MAX_BATCH_TOKENS = 1 << 16
MAX_TIMED_TOKENS = 1 << 20


@dataclass
class QuantizeOptions:
    """Options of `lmforge quantize`: the mode, the smoothing, and the timed batch and its seed."""

    mode: str = option("dynamic", "dynamic: int8 activations too (encoders); weight-only: float activations "
                       "(decoding)", choices=MODES)
    alpha: float | None = option(ALPHA, "SmoothQuant's migration strength for the layers reading a LayerNorm "
                                 "(dynamic); null: no smoothing", low=0, high=1)
    batch_size: int = option(8, "rows of the timed forward batch (with seq_len, at most 65,536 tokens; "
                                "over the rounds, 2^20)", low=1, high=4096)
    seq_len: int | None = option(None, "tokens per row of the timed batch, at most the model's max_seq_len",
                                 low=1, high=MAX_LEN, unset=f"{SEQ_LEN}, or its longest where shorter")
    rounds: int = option(5, "alternating timing rounds", low=1, high=1000)
    seed: int = option(0, "seed of the random tokens drawn: the timed batch, and the smoothing's calibration "
                       "without texts", low=0, high=MAX_SEED)

    def __post_init__(self) -> None:
        check_options(self)  # types, finiteness, bounds and choices
        if self.mode != "dynamic" and self.alpha not in (None, ALPHA):  # ALPHA: the default, said of no mode
            raise OptionsError(f"alpha={self.alpha}: smoothing is for mode dynamic ({self.mode} quantises no "
                               "activations)", "alpha")
        if self.seq_len is not None:  # else once the model says its length (timed_length)
            self.check_timed(self.seq_len)

    def check_timed(self, length: int) -> None:
        """An OptionsError where the timed batch of rows of `length` tokens is over MAX_BATCH_TOKENS (named
        by seq_len where given, as its own bound is the model's), or its rounds over MAX_TIMED_TOKENS."""
        rows = self.batch_size
        if rows * length > MAX_BATCH_TOKENS:
            field, value = ("batch_size", rows) if self.seq_len is None else ("seq_len", length)
            raise OptionsError(f"{field}={value}: {rows * length} tokens in the timed batch ({rows} rows of "
                               f"{length}), over {MAX_BATCH_TOKENS}", field)
        if rows * length * self.rounds > MAX_TIMED_TOKENS:
            timed = rows * length * self.rounds
            raise OptionsError(f"rounds={self.rounds}: {timed} tokens timed ({self.rounds} rounds of "
                               f"{rows * length}), over {MAX_TIMED_TOKENS}", "rounds")
