import torch

import lmforge
from lmforge.model import from_config
from lmforge.apps.summary import describe, flops_per_token, parameter_counts


def test_gpt2_flops_follow_kaplan_and_palm():
    cfg = lmforge.get_config("gpt2")
    with torch.device("meta"):
        model = from_config(cfg, init=False)
    counts = parameter_counts(model)
    # Kaplan et al. 2020: C_forward ~ 2 N + 2 n_layer n_ctx d_attn (+ the output projection);
    # PaLM (App. B) also counts the weighted sum of values: 2 N + 4 n_layer n_ctx d_attn
    palm = 2 * counts["non_embedding"] + 4 * 12 * 1024 * 768 + 2 * 768 * 50257
    assert abs(flops_per_token(cfg, 1024) - palm) / palm < 0.01
    assert counts["total"] == counts["embeddings"] + counts["non_embedding"]


def test_albert_sharing_costs_compute_not_parameters():
    shared = lmforge.get_config("albert-base")
    unshared = shared.replace(share_layers=False)
    assert flops_per_token(shared) == flops_per_token(unshared)


def test_sparse_patterns_cost_less_at_long_context():
    cfg = lmforge.get_config("longformer-base")
    assert flops_per_token(cfg, 4096) < flops_per_token(cfg.replace(attention="full",
                                                                    global_projections=False), 4096)


def test_describe_names_the_parts():
    text = describe(lmforge.build(lmforge.tiny("llama-3.2-1b")))
    assert "rotary" in text and "swiglu" in text and "GQA" in text and "FLOPs/token" in text
