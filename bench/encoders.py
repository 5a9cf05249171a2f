"""Encoder inference (BERT, batch 32 x 128) and sentence-embedding throughput, side by side."""
from __future__ import annotations

import random

import torch

from bench.common import batch, bert_config, encoder_flops, pair, ratio, side_by_side
from lmforge.fast.optimize import optimize
from lmforge.fast.paths import FastPaths


def encoder_inference(repeats: int, quick: bool) -> list:
    """Real tokens/s of lmforge and the reference on all-full and variable-length batches; lmforge
    also under bf16 autocast (against the reference in fp32: the speed a user can have)."""
    from transformers import BertModel

    rows = []
    for name in (("bert-mini",) if quick else ("bert-mini", "bert-base")):
        torch.manual_seed(0)
        cfg = bert_config(name)
        reference, ours = pair(BertModel(cfg))
        for variable in (False, True):
            ids, mask = batch(32, 128, cfg.vocab_size, variable)
            with torch.inference_mode():
                theirs = reference(input_ids=ids, attention_mask=mask).last_hidden_state
                diff = float((ours(ids, mask).last_hidden_state - theirs)[mask.bool()].abs().max())
                runs = side_by_side({"lmforge": lambda: ours(ids, mask),
                                     "reference": lambda: reference(input_ids=ids, attention_mask=mask)}, repeats)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    bf16 = side_by_side({"lmforge": lambda: ours(ids, mask)}, repeats) if not quick else None
                repadded = None
                if variable and not quick:  # the other unpadded attention: re-padded, one SDPA call a layer
                    optimize(ours, paths=FastPaths.frozen(sequence_attention=False, native_attention=False))
                    repadded = side_by_side({"lmforge": lambda: ours(ids, mask)}, repeats)
                    optimize(ours, paths=FastPaths.frozen())
            flops = encoder_flops(cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, mask)
            common = {"model": name, "lengths": "uniform 8..128" if variable else "all 128",
                      "real_tokens": float(mask.sum()), "useful_flops": flops, "max_abs_diff": diff}
            rows.append(_row(common, "fp32", runs["lmforge"], runs["reference"]))
            if bf16 is not None:
                rows.append(_row(common, "bf16", bf16["lmforge"], runs["reference"]))
            if repadded is not None:
                rows.append(_row(common, "fp32, re-padded SDPA (sequence_attention=False, native_attention=False)", repadded["lmforge"], runs["reference"]))
    return rows


def _row(common: dict, precision: str, ours: dict, theirs: dict) -> dict:
    tokens = common["real_tokens"]
    return {**common, "precision": precision, "lmforge_tok_s": tokens / ours["median"],
            "reference_tok_s": tokens / theirs["median"], "ratio": ratio(theirs["median"], ours["median"]),
            "lmforge_s": ours["median"], "reference_s": theirs["median"],
            "runs": {"lmforge": ours["runs"], "reference": theirs["runs"]}}


def _sentences(n: int, seed: int = 0) -> list:
    """n synthetic English-like sentences of 4..60 words (lengths vary as in real corpora)."""
    words = ("the a of to and in is was for on that with as by at from his her they an were which "
             "this be are or had not but have one all their has been new would more who there time "
             "first after two other into most over year only also many some may such people city "
             "river music school war team album film game state world family village season").split()
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 60))).capitalize() + "."
            for _ in range(n)]


def sentence_embeddings(repeats: int, quick: bool) -> list:
    """Sentences/s of lmforge.pipelines.embed and sentence-transformers on all-MiniLM-L6-v2 (tokenising included)."""
    from sentence_transformers import SentenceTransformer

    from lmforge.pipelines.embed import SentenceEncoder
    from lmforge.io import find_model_dir

    path = find_model_dir("all-MiniLM-L6-v2")
    ours = SentenceEncoder.from_dir(path)
    theirs = SentenceTransformer(str(path), device="cpu")
    texts = _sentences(256 if quick else 1024)
    a = ours.encode(texts[:64])
    b = torch.as_tensor(theirs.encode(texts[:64], batch_size=32, normalize_embeddings=True))
    cosine = float((a * b).sum(-1).min())
    with torch.inference_mode():
        runs = side_by_side({"lmforge": lambda: ours.encode(texts, batch_size=32),
                             "reference": lambda: theirs.encode(texts, batch_size=32, normalize_embeddings=True)},
                            repeats)
    ours_s, theirs_s = runs["lmforge"]["median"], runs["reference"]["median"]
    return [{"model": "all-MiniLM-L6-v2", "sentences": len(texts), "lmforge_sent_s": len(texts) / ours_s,
             "reference_sent_s": len(texts) / theirs_s, "ratio": ratio(theirs_s, ours_s),
             "min_cosine": cosine, "runs": runs}]
