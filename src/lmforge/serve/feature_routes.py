"""The route of contextual features (POST /features); the rerankers' are in rerank_routes.py.

/features builds the request's FeatureOptions (analysis/feature_options.py), as `lmforge.features` and
`lmforge features` do, so the three accept and refuse alike; the server's own limits speak first (413
naming max_layers, max_feature_values, max_seq_len, or max_length where the request's is the shorter),
and the texts run batched with other requests of the same options. A model of words (ELMo,
serve/models.py ServedWords) is served here alike: its tokens, counted for the limits and cut by
truncate, are a text's whitespace-separated words.
"""
from __future__ import annotations

import dataclasses

from fastapi import APIRouter, Request

from lmforge.analysis.feature_options import TEXT_POOLINGS, FeatureOptions
from lmforge.analysis.text_features import feature_texts
from lmforge.config.options import OptionsError
from lmforge.serve import option_schemas
from lmforge.serve.limits import RequestError, check_count, fit_lengths, too_large
from lmforge.serve.routes import ERRORS, build_options, clip, length_bound, split
from lmforge.serve.schemas import JSONBody

router = APIRouter(responses=ERRORS)


def _chosen(options: FeatureOptions, served, limits) -> int:
    """The number of layers the answer holds; 413 past max_layers, 422 for a layer the model lacks."""
    if options.pooling not in TEXT_POOLINGS:
        raise RequestError(422, f"pooling={options.pooling!r} pools a word's pieces; a text's tokens take "
                           f"{', '.join(TEXT_POOLINGS)}", param="pooling")
    try:
        count = 1 if options.mixed else len(options.chosen(served.model.config.n_layers + 1))
        if options.mixed:
            options.mix(served.model.config.n_layers + 1)
    except OptionsError as err:
        raise RequestError(422, str(err), param=err.field) from None
    if count > limits.max_layers:
        raise too_large("max_layers",
                        f"layers: {count} layers asked, more than max_layers={limits.max_layers}")
    return count


@router.post("/features", response_model=option_schemas.FeaturesResponse, tags=["analysis"])
async def features(body: option_schemas.FeaturesRequest, request: Request):
    """Contextual features: the chosen layers' (or their scalar mix's) states of each token, with its text
    and character offsets, or pooled per text (mean, max, mean_max, cls, sep, last)."""
    server = request.app.state.server
    served = server.pick(body.model, "features")
    options = build_options(FeatureOptions, body)
    texts = [body.texts] if isinstance(body.texts, str) else body.texts
    check_count(len(texts), server.limits, "texts")
    try:  # a blank text, refused as the library refuses it (before it is queued beside other requests')
        feature_texts(texts)
    except OptionsError as err:
        raise RequestError(422, str(err), param=err.field) from None
    layers = _chosen(options, served, server.limits)
    bound = length_bound(options.max_length, served)
    texts, counts = await clip(server, served, texts, options.truncate, bound)
    lengths = fit_lengths(counts, bound, options.truncate, server.limits)
    if 0 in lengths:  # nothing to give features of (ELMo's text without words), as offline refuses it
        unit = "tokens" if served.tokenizer is not None else "words (ELMo reads whitespace-separated words)"
        raise RequestError(422, f"text {lengths.index(0)} has no {unit}", param="texts")
    width = served.feature_width * (2 if options.pooling == "mean_max" else 1)
    values = sum(layers * width * (n if options.pooling == "none" else 1) for n in lengths)
    if values > server.limits.max_feature_values:
        raise too_large("max_feature_values", f"the answer would hold {values} numbers, more than "
                        f"max_feature_values={server.limits.max_feature_values}: ask fewer layers, pool, or "
                        "send fewer texts")
    options = dataclasses.replace(options, max_length=bound.tokens)
    parts = [({"texts": run, "options": options}, n, len(run))
             for run, n in split(texts, lengths, server.limits)]
    results = await server.run("features", served, parts, key=("features", served.name, repr(options)),
                               interleave=True)
    data = [{"index": i, **found} for i, found in enumerate(f for part in results for f in part)]
    return JSONBody({"model": served.name, "pooling": options.pooling, "data": data})
