"""Request and response bodies of the generation routes, /generate and /v1/completions: their settings are
GenerationOptions fields (help, default and bounds in the spec; type checked here, bounds when the request's
GenerationOptions is built), and prefix_lm, lmforge.generate's argument (CallOptions: checked as Python checks
it). A GenerationOptions or CallOptions field a route does not take is refused by its name, saying why
(refused_name): /v1/completions ignores the extras OpenAI clients send, and /generate, which refuses unknown
fields, would answer only pydantic's "Extra inputs are not permitted".
"""
from __future__ import annotations

import dataclasses
import functools
import json
import operator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, create_model

from lmforge.config.options import BASE_TYPES, MAX_SEED, OptionsError, bounds_text, members
from lmforge.generate.call_options import CALL_FIELDS, SERVED, checked_call_value
from lmforge.generate.options import EARLY_STOPPING, FIELDS, checked_type, checked_value, field_kind
from lmforge.serve.schemas import (MODEL_FIELD, OPENAI, SOME, STRICT, Usage, WholeInt, field_error,
                                   refused_name)


def option_field(name: str, default: Any = dataclasses.MISSING, note: str = "") -> tuple:
    """(type, Field) of the GenerationOptions field `name` for a request model: its help, default and
    bounds in the schema. Its type is checked here as the options object checks it (a bool is not a
    number, "3" is not 3); its bounds are checked when the request's GenerationOptions is built
    (generation.Settings), after the server's Limits, which may be stricter and answer 413."""
    spec = FIELDS[name]
    types = [{"int": int, "float": float, "bool": bool, "str": str, "list": list[int]}[m]
             for m in members(field_kind(name))]
    meta, kind = spec.metadata, functools.reduce(operator.or_, types)  # early_stopping: bool | str
    bounds = {("exclusiveMinimum" if meta["open_low"] else "minimum"): meta["low"], "maximum": meta["high"]}
    return (Annotated[kind, BeforeValidator(functools.partial(typed, name))],
            Field(spec.default if default is dataclasses.MISSING else default,
                  description=meta["help"] + bounds_text(meta) + note,
                  json_schema_extra={k: v for k, v in bounds.items() if v is not None}))


def spelt(values) -> str:
    """'true, false or "never"': `values` as a client writes them in JSON."""
    words = [json.dumps(v) for v in values]
    return ", ".join(words[:-1]) + " or " + words[-1]


# a setting of a few values, said by them rather than by its Python annotation (Union[bool, str])
VALUES = {"early_stopping": spelt(EARLY_STOPPING)}


def typed(name: str, value, least: bool = False):
    """`value` as GenerationOptions field `name`'s type (checked_type), a refusal in the API's words and
    without pydantic's "Value error, " before it. A null is refused rather than read as the default, as
    lmforge.generate and `lmforge generate` refuse None: GenerationOptions.build takes every field given.
    `least`: below the field's least too (a field under another name, which build() would not name)."""
    try:
        if value is None or (name in VALUES and not isinstance(value, (bool, str))):
            wanted = VALUES.get(name) or " or ".join(BASE_TYPES[m] for m in members(field_kind(name)))
            raise OptionsError(f"{name} must be {wanted}, got {json.dumps(value)[:60]}", name)
        value = checked_type(name, value)
        if least and value < FIELDS[name].metadata["low"]:  # its most: the server's Limits' first (413)
            checked_value(name, value)
        return value
    except OptionsError as err:
        raise field_error(err, name) from None


def call_field(name: str) -> tuple:
    """(type, Field) of lmforge.generate's argument `name` (a CallOptions field: its help and default) for a
    request model, checked as Python checks the argument: a null is refused, as generate refuses None."""
    spec = CALL_FIELDS[name]

    def checked(value):
        try:
            return checked_call_value(name, value)
        except OptionsError as err:
            raise field_error(err, name) from None
    kind = {"bool": bool, "str": str}[spec.type]
    extra = {"enum": list(spec.metadata["choices"])} if spec.metadata["choices"] else None
    return (Annotated[kind, BeforeValidator(checked)],
            Field(spec.default, description=spec.metadata["help"], json_schema_extra=extra))


# the GenerationOptions fields a request may set (generation.Settings holds them); sampling is said by
# temperature (0: greedy, > 0: samples), so do_sample is not one of them. The forced and suppressed ids
# are taken so that a served model's own can be switched off (-1, []), as in the other faces
DECODING = ("top_k", "top_p", "num_beams", "length_penalty", "early_stopping", "repetition_penalty",
            "no_repeat_ngram_size", "min_new_tokens", "min_length", "forced_bos_token_id",
            "forced_eos_token_id", "suppress_tokens")


class DecodingBase(BaseModel):
    """The settings of /generate and /v1/completions that are not GenerationOptions fields."""

    model_config = STRICT
    model: str | None = MODEL_FIELD
    seed: WholeInt | None = Field(None, ge=0, le=MAX_SEED, description="sampling: the same seed gives the "
                                   "same text")
    stop: str | list[str] | None = Field(None, description="the text ends before any of these")
    stream: bool = Field(False, description="send tokens as server-sent events as they are generated")


Decoding = create_model("Decoding", __base__=DecodingBase, __module__=__name__,
                        __doc__="Decoding settings shared by /generate and /v1/completions "
                                "(GenerationOptions fields and prefix_lm; beam search not with stream or "
                                "sampling).",
                        **{name: option_field(name) for name in DECODING},
                        **{name: call_field(name) for name in SERVED})

# lmforge's names of settings that a generation route takes under another name, by route
RENAMED = {"/generate": {"do_sample": "temperature (0: greedy, > 0: samples)"},
           "/v1/completions": {"max_new_tokens": "max_tokens", "num_return_sequences": "n (only 1)",
                               "do_sample": "temperature (0: greedy, > 0: samples)"}}
# token ids the server takes from the served model (its config and tokenizer), never from a request
MODEL_IDS = {name for name in FIELDS if name.endswith("_token_id") and name not in DECODING}


def setting_refused(route: str, name: str) -> tuple:
    """refused_name of lmforge's setting `name` sent to `route`, which does not take it under that name:
    the route's own name where it has one, else why it is not taken."""
    if name in RENAMED[route]:
        return refused_name(f"{route} takes {RENAMED[route][name]}")
    if name in CALL_FIELDS:
        return refused_name("a speed setting of lmforge.generate (the same tokens), which the server "
                            "chooses itself")
    if name in MODEL_IDS:
        return refused_name(f"the served model's own token id (its config's and tokenizer's), which {route} "
                            "does not take")
    return refused_name(f"lmforge's generation setting, which {route} does not take")


GENERATE_FIELDS = {"prompt": (str, ...), "max_new_tokens": option_field("max_new_tokens"),
                   "temperature": option_field("temperature", 0.0, "; here 0 (the default) is greedy, > 0 "
                                               "samples")}
GenerateRequest = create_model(
    "GenerateRequest", __base__=Decoding, __module__=__name__,
    __doc__="Continue a prompt (decoders) or answer it (encoder-decoders).", **GENERATE_FIELDS,
    **{name: setting_refused("/generate", name)
       for name in sorted((FIELDS.keys() | CALL_FIELDS.keys()) - Decoding.model_fields.keys()
                          - GENERATE_FIELDS.keys())})


class CompletionUsage(Usage):
    """Tokens read and written."""

    completion_tokens: int


class GenerateResponse(BaseModel):
    """The new text, its ids, why it ended and the tokens used (streamed: the last event)."""

    model: str
    text: str
    token_ids: list[int]
    finish_reason: Literal["stop", "length"]
    seed: int | None = Field(None, description="the sampling seed used (the request's, else one drawn): "
                                               "sent as seed, it gives this text again; null: not sampled")
    usage: CompletionUsage


OpenAITemperature, OPENAI_TEMPERATURE = option_field("temperature", 1.0, "; OpenAI's default 1 samples; 0 is "
                                                     "greedy")


class OpenAICompletion(Decoding):
    """OpenAI's (legacy) completions request; lmforge's decoding settings are accepted too."""

    model_config = OPENAI
    prompt: str | list[str] = Field(..., json_schema_extra=SOME)
    max_tokens: Annotated[int, BeforeValidator(functools.partial(typed, "max_new_tokens", least=True)),
                          Field(json_schema_extra={"minimum": 1})] = 16
    # checked as /generate's is (its bounds in GenerationOptions' words; they were pydantic's)
    temperature: OpenAITemperature = OPENAI_TEMPERATURE
    n: WholeInt = Field(1, ge=1, le=1, description="only 1")
    echo: bool = Field(False, description="put the prompt before the completion")
    # OpenAI's settings lmforge does not serve: refused where they would change the answer, never ignored
    best_of: WholeInt = Field(1, ge=1, le=1, description="only 1")
    logprobs: None = Field(None, description="not supported: leave out")
    suffix: None = Field(None, description="not supported: leave out")
    presence_penalty: float = Field(0.0, ge=0, le=0, description="not supported: only 0")
    frequency_penalty: float = Field(0.0, ge=0, le=0, description="not supported: only 0")
    logit_bias: dict[str, float] | None = Field(None, max_length=0, description="not supported: leave out")
    user: str | None = None


# lmforge's names of settings (GenerationOptions' fields, /generate's) that /v1/completions does not take
# under them: refused, since an OpenAI client's unknown extras are ignored and they would be too, silently
LMFORGE_NAMES = sorted((FIELDS.keys() | GenerateRequest.model_fields.keys())
                       - OpenAICompletion.model_fields.keys())


CompletionRequest = create_model(
    "CompletionRequest", __base__=OpenAICompletion, __module__=__name__, __doc__=OpenAICompletion.__doc__,
    **{name: setting_refused("/v1/completions", name) for name in LMFORGE_NAMES})


class CompletionChoice(BaseModel):
    """One prompt's completion (token_ids and seed: lmforge extensions)."""

    text: str
    index: int
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None
    token_ids: list[int] = []
    seed: int | None = Field(None, description="the sampling seed used (the request's, else one drawn); "
                                               "null: not sampled")


class CompletionResponse(BaseModel):
    """OpenAI's completions response (streamed: chunks of the same shape, then [DONE])."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None
