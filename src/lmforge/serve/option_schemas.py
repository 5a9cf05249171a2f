"""Request and response bodies made from options objects: /embed's and /v1/embeddings' (EmbedOptions),
/features' (FeatureOptions) and /fill_mask's (FillOptions), each field's help, default, bounds and choices in
the spec; the values are judged when the route builds the options object, so the server refuses what the
library and the command refuse. A null is the field not given (its default), as the objects' build() reads a
Python None; /fill_mask refuses a null, as lmforge.fill_mask refuses None.
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, Field, create_model

from lmforge.analysis.feature_options import FeatureOptions
from lmforge.config.options import OptionsError, base_type, bounds_text, coerce, whole_kind
from lmforge.pipelines.embed_options import EmbedOptions
from lmforge.pipelines.fill_mask import FillOptions
from lmforge.serve.schemas import EXACT, MODEL_FIELD, OPENAI, SOME, field_error, refused_name


def options_fields(cls, skip: tuple = (), nullable: bool = True, notes: dict | None = None) -> dict:
    """name -> (type, Field) of each field of the options dataclass `cls` (its help, default, bounds and
    choices in the schema, then its words in `notes`); the values are judged when the request's options object
    is built. Each may be null, read as not given: build() drops a None (drop_none), as lmforge.embed's
    keyword arguments do; not `nullable`: a null is refused, as a function that takes no None refuses it."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        meta = f.metadata
        extra = _bounds(meta)
        if meta.get("choices"):
            extra["enum"] = [*meta["choices"], None]
        if meta.get("items"):  # a list of numbers: the bounds are each item's, in the array's own schema
            extra = _list_schema(meta, extra)
        described = meta.get("help", "") + bounds_text(meta) + (notes or {}).get(f.name, "")
        kind = hints[f.name] | None if nullable else hints[f.name]
        # a whole 3.0 is 3, as the library and a config file read it: an int field's, and a union's that
        # admits an int and no float (layers: int | str | list, where 2.0 was refused as no integer)
        if whole_kind(base_type(f.type)[0]):
            kind = Annotated[kind, BeforeValidator(functools.partial(_whole, cls, f.name))]
        out[f.name] = (kind, Field(f.default, description=described, json_schema_extra=extra or None))
    return out


def _whole(cls, name: str, value):
    """A whole float as the int it is (coerce), other values as given for the schema's strict type to judge;
    a fraction is refused in the API's words."""
    if not isinstance(value, float):
        return value
    try:
        return coerce(cls, name, value, from_text=False)
    except OptionsError as err:
        raise field_error(err, name) from None


def _bounds(meta: dict) -> dict:
    """JSON Schema's minimum / maximum (exclusive where the option's bound is open) of a number option."""
    names = (("low", "exclusiveMinimum" if meta.get("open_low") else "minimum"),
             ("high", "exclusiveMaximum" if meta.get("open_high") else "maximum"))
    return {name: meta[key] for key, name in names if meta.get(key) is not None}


def _list_schema(meta: dict, bounds: dict):
    """pydantic's schema hook giving the array (itself, or its branch of an Optional's anyOf) its item
    type and bounds, its count and, if distinct, uniqueItems."""
    items = meta["items"]
    keywords = {"items": {"type": "integer" if items.kind == "int" else "number", **bounds},
                "minItems": items.min_items, "maxItems": items.max_items,
                **({"uniqueItems": True} if items.distinct else {})}

    def apply(schema: dict) -> None:
        for branch in schema.get("anyOf", [schema]):
            if branch.get("type") == "array":
                branch.update(keywords)
    return apply


class TextsBase(BaseModel):
    """Texts and the model that reads them."""

    model_config = EXACT
    texts: str | list[str] = Field(..., json_schema_extra=SOME)
    model: str | None = MODEL_FIELD


EmbedRequest = create_model("EmbedRequest", __base__=TextsBase, __module__=__name__,
                            __doc__="Sentence embeddings of texts (lmforge.embed's EmbedOptions).",
                            **options_fields(EmbedOptions))


class EmbeddingsBase(BaseModel):
    """OpenAI's embeddings request without lmforge's settings."""

    model_config = OPENAI
    input: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="a text or a list of texts (token ids, which OpenAI also takes, are refused: "
        "they would be another tokenizer's)", json_schema_extra=SOME)
    model: str | None = MODEL_FIELD
    user: str | None = Field(None, description="OpenAI's: taken and unused")


# /embed's texts, and /features' settings no embedding reads (FeatureOptions' fields beyond EmbedOptions')
NOT_TAKEN = {"texts": "/v1/embeddings takes input",
             **{f.name: "a setting of /features (FeatureOptions), which /v1/embeddings does not take"
                for f in dataclasses.fields(FeatureOptions)
                if f.name not in {g.name for g in dataclasses.fields(EmbedOptions)}}}
EmbeddingsRequest = create_model(
    "EmbeddingsRequest", __base__=EmbeddingsBase, __module__=__name__,
    __doc__="OpenAI's embeddings request, with every EmbedOptions field of /embed (encoding_format: OpenAI's "
            "float and base64, and lmforge's others).", **options_fields(EmbedOptions),
    **{name: refused_name(why) for name, why in NOT_TAKEN.items()})


# a text's tokens as every face counts them (lmforge.features, SentenceEncoder.embed_with, the server): the
# whole text's count would need the whole text tokenised, and the server reads only a long text's head
READ = ("the tokens the model read, special ones and a prompt included: at most max_length (the model's "
        "max_tokens, /info) where truncate cut the text; a chunked text's all")


class InputInfo(BaseModel):
    """What became of one input: the tokens read (prompt included), whether it was cut, its windows."""

    tokens: int = Field(..., description=READ)
    truncated: bool = Field(..., description="whether truncate cut the text to max_length")
    chunks: int = 1


class EmbedResponse(BaseModel):
    """One embedding per text, in the order given, in the asked encoding."""

    model: str
    embeddings: list[list[float]] | list[str] | list[list[int]]
    encoding_format: str
    dim: int = Field(..., description="coordinates of each vector (before packing bits)")
    tokens: int = Field(..., description="the inputs' tokens read, all together")
    inputs: list[InputInfo]


FeaturesRequest = create_model("FeaturesRequest", __base__=TextsBase, __module__=__name__,
                               __doc__="Contextual features of texts (lmforge.features' FeatureOptions).",
                               **options_fields(FeatureOptions))


class FillBase(BaseModel):
    """A text with one mask and the model that fills it."""

    model_config = EXACT
    text: str
    model: str | None = MODEL_FIELD


# lmforge.fill_mask refuses top_k=None (and the command line has no null): so is a null here, not a default
FillMaskRequest = create_model(
    "FillMaskRequest", __base__=FillBase, __module__=__name__,
    __doc__="A text with one [MASK] (or <mask>) to fill (lmforge.fill_mask's FillOptions).",
    **options_fields(FillOptions, nullable=False,
                     notes={"top_k": "; at most the server's max_top_k (413 beyond, /info)"}))


class FeatureToken(BaseModel):
    """A token: its id (None for ELMo's words), its piece, the text it covers and where."""

    id: int | None
    token: str
    text: str
    start: int
    end: int


class TextFeature(BaseModel):
    """One text's features: [layer][token][d] (pooling none) or [layer][d]; one layer for a mix."""

    index: int
    layers: list[int] | str
    n_tokens: int = Field(..., description=READ.removesuffix("; a chunked text's all"))
    truncated: bool = Field(..., description="whether truncate cut the text to max_length")
    tokens: list[FeatureToken] | None = None
    features: list


class FeaturesResponse(BaseModel):
    """The features of each text, in order."""

    model: str
    pooling: str
    data: list[TextFeature]
