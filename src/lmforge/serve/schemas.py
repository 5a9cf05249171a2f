"""Request and response bodies of every route: they validate input and make the OpenAPI spec.

/v1/embeddings and /v1/completions follow OpenAI's schemas (unknown fields are ignored, as
clients send extras, but lmforge's own names of settings the route does not take are refused);
lmforge's own routes refuse unknown fields, so a typo is an error rather than a silently ignored
setting. No float may be NaN or infinite. /v1/embeddings', /embed's, /features' and /fill_mask's requests
are made in option_schemas.py, the generation routes' in generation_schemas.py.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

import pydantic_core
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from lmforge.config.options import OptionsError, whole_number

# no coercion anywhere: "8" is not 8, true is not 1, "no" is not false (a client's typo, refused: 422)
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
# made from an options dataclass: no coercion ("3" is not 3), the object's checks name the field (422)
EXACT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
OPENAI = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


# an int of a request that is no options object's field: 3.0 is 3 there as well (JSON Schema's integer), as
# the options objects' fields read it; a fraction, a bool or a string is left for the strict int to refuse
WholeInt = Annotated[int, BeforeValidator(whole_number)]
MODEL_FIELD = Field(None, description="a served model's name (default: the first that can do this): /info")
TRUNCATE = Field(False, description="cut texts longer than the model's limit instead of refusing them (413)")
# a request's list of texts or records: one of none is refused (limits.check_count: 422), as the spec says
SOME = {"minItems": 1}


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
    tagging {text} or {words}, qa {question, context}, seq2seq {text}. A plain string is {text}; a text
    may be a number or boolean, read as JSON writes it; gold fields (label, tags, answers, target, id) are
    checked as evaluate checks them, and not used."""

    model_config = STRICT
    inputs: str | dict[str, Any] | list[str | dict[str, Any]] = Field(..., json_schema_extra=SOME)
    model: str | None = MODEL_FIELD
    truncate: bool = TRUNCATE


class Tag(BaseModel):
    """A word and its predicted tag."""

    word: str
    tag: str | None = Field(description="null for a word the model did not read (past max_len when "
                                        "truncated, or a word the tokenizer gives no pieces)")


class Prediction(BaseModel):
    """One record's prediction; the fields present depend on the task."""

    label: str | None = Field(None, description="cls, pair: the most probable label")
    labels: list[str] | None = Field(None, description="multilabel: the labels over the threshold")
    scores: dict[str, float] | list[float] | None = Field(
        None, description="cls, pair, multilabel: each label's probability; choice: each choice's")
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


def field_error(err: OptionsError, name: str) -> PydanticCustomError:
    """An options object's refusal of field `name` as the request schema's error: the route's answer says
    the field before the message, so the message does not say it again (nor pydantic's "Value error, ")."""
    why = str(err).removeprefix(f"{name} ")
    return PydanticCustomError("value_error", "{why}", {"why": why})


def refused_name(why: str) -> tuple:
    """(type, Field) of a name a route does not take, which an OpenAI route's config would ignore unsaid and
    a strict one refuse without a reason: any value, null too, is a 422 naming it, saying `why` (hidden
    from the spec: never taken)."""
    def refuse(value):
        raise PydanticCustomError("lmforge_name", why)
    return SkipJsonSchema[Annotated[Any, BeforeValidator(refuse)]], Field(None, exclude=True, repr=False)


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
    threads_per_worker: list[int] = Field(..., description="torch threads of each worker, the first "
                                          "first (an even share; the first ones one more where threads do "
                                          "not divide)")
