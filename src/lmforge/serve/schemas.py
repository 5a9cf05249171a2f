"""Request and response bodies of every route: they validate input and make the OpenAPI spec.

/v1/embeddings and /v1/completions follow OpenAI's schemas (unknown fields are ignored, as
clients send extras, but lmforge's own names of settings the route does not take are refused);
lmforge's own routes refuse unknown fields, so a typo is an error rather than a silently ignored
setting. No float may be NaN or infinite. /v1/embeddings' request is made in option_schemas.py.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import operator
from typing import Annotated, Any, Literal

import pydantic_core
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, create_model
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from lmforge.config.options import BASE_TYPES, OptionsError, bounds_text, members
from lmforge.generate.options import EARLY_STOPPING, FIELDS, checked_type, checked_value, field_kind
from lmforge.pipelines.fill_mask import MAX_SPAN

# no coercion anywhere: "8" is not 8, true is not 1, "no" is not false (a client's typo, refused: 422)
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
# made from an options dataclass: no coercion ("3" is not 3), the object's checks name the field (422)
EXACT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
OPENAI = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)
MODEL_FIELD = Field(None, description="a served model's name (default: the first that can do this): /info")
TRUNCATE = Field(False, description="cut texts longer than the model's limit instead of refusing them (413)")


class JSONBody(JSONResponse):
    """A JSON response rendered by pydantic's Rust serializer: a 384-float embedding takes ~17 us instead of
    json.dumps's ~167, time in which the event loop holds the GIL the model's worker needs between ops.
    NaN and infinity, which JSON cannot carry, still raise as in starlette's JSONResponse."""

    def render(self, content: Any) -> bytes:
        """The UTF-8 JSON of `content`; starlette's own rendering where a non-finite float may be in it."""
        body = pydantic_core.to_json(content)
        if b"NaN" in body or b"Infinity" in body:  # a non-finite float (or only a text saying so)
            return super().render(content)
        return body


class ErrorBody(BaseModel):
    """What went wrong, in one line, and the parameter or limit at fault."""

    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """Every error answer (OpenAI's shape)."""

    error: ErrorBody


class Usage(BaseModel):
    """Tokens read."""

    prompt_tokens: int
    total_tokens: int


class Embedding(BaseModel):
    """One text's embedding (base64: little-endian float32)."""

    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str
    index: int


class EmbeddingsResponse(BaseModel):
    """OpenAI's embeddings response."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class PredictRequest(BaseModel):
    """Inputs for a fine-tuned task model; a record's fields follow the model's task (its task.json):
    cls {text}, pair {text, text_pair}, regression {text, text_pair?}, choice {text, choices},
    tagging {text} or {words}, qa {question, context}, seq2seq {text}. A plain string is {text}."""

    model_config = STRICT
    inputs: str | dict[str, Any] | list[str | dict[str, Any]]
    model: str | None = MODEL_FIELD
    truncate: bool = TRUNCATE


class Tag(BaseModel):
    """A word and its predicted tag."""

    word: str
    tag: str


class Prediction(BaseModel):
    """One record's prediction; the fields present depend on the task."""

    label: str | None = Field(None, description="cls, pair: the most probable label")
    scores: dict[str, float] | list[float] | None = Field(
        None, description="cls, pair: each label's probability; choice: each choice's")
    value: float | None = Field(None, description="regression")
    choice: int | None = Field(None, description="choice: the most probable choice")
    tags: list[Tag] | None = Field(None, description="tagging: a tag per word")
    answer: str | None = Field(None, description="qa: the answer span ('' when unanswerable)")
    start: int | None = Field(None, description="qa: the answer's first character in the context")
    end: int | None = Field(None, description="qa: one past its last character")
    score: float | None = Field(None, description="qa: start + end logit of the answer")
    text: str | None = Field(None, description="seq2seq: the generated text")


class PredictResponse(BaseModel):
    """One prediction per input record."""

    model: str
    task: str
    predictions: list[Prediction]


class FillMaskRequest(BaseModel):
    """A text with one [MASK] (or <mask>) to fill."""

    model_config = STRICT
    text: str
    model: str | None = MODEL_FIELD
    top_k: StrictInt = Field(5, ge=1, description="candidates returned (at most the server's max_top_k; "
                             "a T5 / BART model's at most its 64 beams)")
    max_span: StrictInt = Field(10, ge=1, le=MAX_SPAN, description="T5 / BART: most tokens generated for the "
                                "mask (the pipeline's bound: the same in Python and on the command line)")


class Candidate(BaseModel):
    """A filling, its probability and the filled text."""

    token: str
    score: float
    sequence: str
    token_id: int | None = None


class FillMaskResponse(BaseModel):
    """Candidates, most probable first."""

    model: str
    candidates: list[Candidate]


def option_field(name: str, default: Any = dataclasses.MISSING, note: str = "") -> tuple:
    """(type, Field) of the GenerationOptions field `name` for a request model: its help, default and
    bounds in the schema. Its type is checked here as the options object checks it (a bool is not a
    number, "3" is not 3); its bounds are checked when the request's GenerationOptions is built
    (generation.Settings), after the server's Limits, which may be stricter and answer 413."""
    spec = FIELDS[name]
    types = [{"int": int, "float": float, "bool": bool, "str": str}[m] for m in members(field_kind(name))]
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


def field_error(err: OptionsError, name: str) -> PydanticCustomError:
    """An options object's refusal of field `name` as the request schema's error: the route's answer says
    the field before the message, so the message does not say it again (nor pydantic's "Value error, ")."""
    why = str(err).removeprefix(f"{name} ")
    return PydanticCustomError("value_error", "{why}", {"why": why})


# the GenerationOptions fields a request may set (generation.Settings holds them); sampling is said by
# temperature (0: greedy, > 0: samples), so do_sample is not one of them
DECODING = ("top_k", "top_p", "num_beams", "length_penalty", "early_stopping", "repetition_penalty",
            "no_repeat_ngram_size", "min_new_tokens", "min_length")


class DecodingBase(BaseModel):
    """The settings of /generate and /v1/completions that are not GenerationOptions fields."""

    model_config = STRICT
    model: str | None = MODEL_FIELD
    seed: StrictInt | None = Field(None, ge=0, le=2**63 - 1, description="sampling: the same seed gives the "
                                   "same text")
    stop: str | list[str] | None = Field(None, description="the text ends before any of these")
    stream: bool = Field(False, description="send tokens as server-sent events as they are generated")


Decoding = create_model("Decoding", __base__=DecodingBase, __module__=__name__,
                        __doc__="Decoding settings shared by /generate and /v1/completions (GenerationOptions "
                                "fields; beam search not with stream or sampling).",
                        **{name: option_field(name) for name in DECODING})

GenerateRequest = create_model(
    "GenerateRequest", __base__=Decoding, __module__=__name__,
    __doc__="Continue a prompt (decoders) or answer it (encoder-decoders).",
    prompt=(str, ...), max_new_tokens=option_field("max_new_tokens"),
    temperature=option_field("temperature", 0.0, "; here 0 (the default) is greedy, > 0 samples"))


class CompletionUsage(Usage):
    """Tokens read and written."""

    completion_tokens: int


class GenerateResponse(BaseModel):
    """The new text, its ids, why it ended and the tokens used (streamed: the last event)."""

    model: str
    text: str
    token_ids: list[int]
    finish_reason: Literal["stop", "length"]
    usage: CompletionUsage


OpenAITemperature, OPENAI_TEMPERATURE = option_field("temperature", 1.0, "; OpenAI's default 1 samples; 0 is "
                                                     "greedy")


class OpenAICompletion(Decoding):
    """OpenAI's (legacy) completions request; lmforge's decoding settings are accepted too."""

    model_config = OPENAI
    prompt: str | list[str]
    max_tokens: Annotated[int, BeforeValidator(functools.partial(typed, "max_new_tokens", least=True)),
                          Field(json_schema_extra={"minimum": 1})] = 16
    # checked as /generate's is (its bounds in GenerationOptions' words; they were pydantic's)
    temperature: OpenAITemperature = OPENAI_TEMPERATURE
    n: int = Field(1, ge=1, le=1, description="only 1")
    echo: bool = Field(False, description="put the prompt before the completion")
    # OpenAI's settings lmforge does not serve: refused where they would change the answer, never ignored
    best_of: int = Field(1, ge=1, le=1, description="only 1")
    logprobs: None = Field(None, description="not supported: leave out")
    suffix: None = Field(None, description="not supported: leave out")
    presence_penalty: float = Field(0.0, ge=0, le=0, description="not supported: only 0")
    frequency_penalty: float = Field(0.0, ge=0, le=0, description="not supported: only 0")
    logit_bias: dict[str, float] | None = Field(None, max_length=0, description="not supported: leave out")
    user: str | None = None


# /v1/completions' own names of lmforge's settings; the rest of LMFORGE_NAMES it does not take at all
ROUTE_NAMES = {"max_new_tokens": "max_tokens", "num_return_sequences": "n (only 1)",
               "do_sample": "temperature (0: greedy, > 0: samples)"}
# lmforge's names of settings (GenerationOptions' fields, /generate's) that /v1/completions does not take
# under them: refused, since an OpenAI client's unknown extras are ignored and they would be too, silently
LMFORGE_NAMES = sorted((FIELDS.keys() | GenerateRequest.model_fields.keys())
                       - OpenAICompletion.model_fields.keys())


def refused_name(why: str) -> tuple:
    """(type, Field) of a name an OpenAI route does not take, which its config would ignore unsaid: any
    value, null too, is a 422 naming it, saying `why` (hidden from the spec: never taken)."""
    def refuse(value):
        raise PydanticCustomError("lmforge_name", why)
    return SkipJsonSchema[Annotated[Any, BeforeValidator(refuse)]], Field(None, exclude=True, repr=False)


def lmforge_name(name: str) -> tuple:
    """refused_name of a setting sent to /v1/completions under lmforge's name `name`, with the route's own
    name where it has one."""
    return refused_name(f"/v1/completions takes {ROUTE_NAMES[name]}" if name in ROUTE_NAMES
                        else "lmforge's generation setting, which /v1/completions does not take")


CompletionRequest = create_model(
    "CompletionRequest", __base__=OpenAICompletion, __module__=__name__, __doc__=OpenAICompletion.__doc__,
    **{name: lmforge_name(name) for name in LMFORGE_NAMES})


class CompletionChoice(BaseModel):
    """One prompt's completion (token_ids: an lmforge extension)."""

    text: str
    index: int
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None
    token_ids: list[int] = []


class CompletionResponse(BaseModel):
    """OpenAI's completions response (streamed: chunks of the same shape, then [DONE])."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


class TokenizeRequest(BaseModel):
    """A text to split into the model's tokens."""

    model_config = STRICT
    text: str
    model: str | None = MODEL_FIELD
    add_special_tokens: bool = True


class TokenizeResponse(BaseModel):
    """The ids and token strings of a text."""

    model: str
    ids: list[int]
    tokens: list[str]
    count: int


class HealthResponse(BaseModel):
    """Whether the server takes work."""

    status: Literal["ok", "draining"]
    models: list[str]
    queue: int


class ModelInfo(BaseModel):
    """A served model: its name and sizes, what it can do, its limit and config (never its path on disk)."""

    name: str = Field(..., description="the name it is served under (--model NAME=DIR)")
    architecture: str
    capabilities: list[str]
    max_tokens: int
    parameters: int = Field(..., description="the backbone's weights, int8 ones included, heads excluded "
                                             "(as lmforge inspect counts them)")
    parameters_counted: str = Field(..., description="what `parameters` counts, in words")
    n_layers: int = Field(..., description="Transformer blocks (an encoder-decoder's encoder)")
    d_model: int
    vocab_size: int
    embedding_dim: int | None = Field(..., description="the size of /embed's and /v1/embeddings' vectors "
                                      "(None: the model does not embed, as ELMo)")
    task: dict[str, Any] | None = None
    pooling: list[str]
    config: dict[str, Any]


class OpenAIModel(BaseModel):
    """A served model as OpenAI's model list shows it, with what it can do (an lmforge extension)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    capabilities: list[str] = Field([], description="embed, features, rerank, predict, fill_mask, generate, "
                                    "tokenize, attention: the routes this model serves (route by `model`)")


class ModelList(BaseModel):
    """OpenAI's model list: the served models."""

    object: Literal["list"] = "list"
    data: list[OpenAIModel]


class InfoResponse(BaseModel):
    """The served models, the limits, the threads and the workers sharing them."""

    version: str
    models: dict[str, ModelInfo]
    limits: dict[str, int | float] = Field(..., description="every limit of Limits (413 and 429 name them)")
    threads: int = Field(..., description="torch threads of all the workers together")
    workers: int = Field(..., description="model worker threads (the first runs every kind of job, the "
                         "others batches of embeddings and predictions)")
    threads_per_worker: list[int] = Field(..., description="torch threads of each worker, the first first (an "
                                          "even share; the first ones one more where threads do not divide)")
