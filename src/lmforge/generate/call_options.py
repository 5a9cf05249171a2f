"""CallOptions: lmforge.generate's plain-value arguments beside its decoding settings (GenerationOptions),
each declared once with its type, default and help, as GenerationOptions' fields are.

`lmforge.generate(..., prefix_lm=, use_cache=, projection=)` checks each argument by its declaration
(checks.check_call); `lmforge generate --prefix-lm` and the server's generation requests' `prefix_lm` are
made from it too, so the three faces accept, refuse and help alike. SERVED names the ones every face
takes: prefix_lm changes the tokens (how the prompt is read). use_cache and projection are speed settings
that give the same tokens: Python takes them to compare or debug the fast paths, while the command line
and the server pick the fast path themselves (a client's use_cache=false would make the server recompute
every position at every step), so the server refuses them by name, saying so (serve/generation_schemas.py).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from lmforge.config.options import checked_as, option
from lmforge.generate.vocab.projection import MODES


@dataclass(frozen=True)
class CallOptions:
    """How a generate call reads its prompt (prefix_lm) and how fast it runs (use_cache, projection)."""

    prefix_lm: bool = option(False, "read the prompt bidirectionally, as a decoder pretrained as a prefix LM "
                             "does (lmforge pretrain --objective prefix-lm); not for an encoder-decoder, "
                             "whose encoder already reads it so")
    use_cache: bool = option(True, "keep each position's keys and values between steps (false: recompute "
                             "every position at every step; the same tokens, slower)")
    projection: str = option("auto", "how the vocabulary projection is computed: auto (the fastest way timed "
                             "on this machine), plain, input-major or screen; the same tokens",
                             choices=MODES)


CALL_FIELDS = {f.name: f for f in fields(CallOptions)}
SERVED = ("prefix_lm",)  # taken by every face; the others are Python's alone (the module's docstring: why)


def checked_call_value(name: str, value):
    """`value` of generate's argument `name` as CallOptions declares it, else an OptionsError naming it."""
    return checked_as(CallOptions, name, value)
