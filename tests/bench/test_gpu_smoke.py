"""bench/gpu.py's CI smoke run: tiny models on the CPU write the one JSON with every measurement."""
import json

import pytest

pytest.importorskip("transformers")


@pytest.mark.slow  # a benchmark harness, not the library: CI's `make test-slow` runs it
def test_tiny_cpu_run_writes_every_measurement(tmp_path):
    from bench.gpu import main

    out = tmp_path / "gpu.json"
    assert main(["--device", "cpu", "--tiny", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["tiny"] is True
    for part in ("bert_base_mlm", "gpt2_124m_clm"):
        row = result[part]
        assert row["lmforge"]["tokens_per_s"] > 0 and row["reference"]["tokens_per_s"] > 0
        assert row["lmforge"]["mfu"] is None  # no peak FLOP/s known for a CPU
        assert row["flops_per_token"] > 0 and row["speedup"] > 0
    for rows in ("batch_1", "batch_64"):
        assert result["gpt2_generation"][rows]["lmforge"]["tokens_per_s"] > 0
    embeddings = result["minilm_embeddings"]
    assert "skipped" in embeddings or embeddings["lmforge"]["sentences_per_s"] > 0
    elmo = result["elmo_small_bilm"]
    assert elmo["fused"]["ms_per_step"] > 0 and elmo["steps"]["ms_per_step"] > 0 and elmo["cell_clip"] == 3
    assert elmo["steps"]["fused_share"] == 0 and 0 <= elmo["fused"]["fused_share"] <= 1
    parts = {"bert_base_mlm", "gpt2_124m_clm", "gpt2_generation", "minilm_embeddings", "elmo_small_bilm"}
    assert set(result["seconds"]) == parts
