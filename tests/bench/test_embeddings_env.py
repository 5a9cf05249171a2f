"""bench.embeddings_vs_onnx: every arm runs in the allocator environment the JSON names, and only that."""
from bench import embeddings_vs_onnx as bench
from bench.run import ENVS


def test_tuned_sets_the_allocator_and_default_passes_none_of_the_callers_on(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1")  # the caller's own: not what the JSON would say
    monkeypatch.setitem(bench.ALLOCATOR, "env", "tuned")
    tuned = bench._env()
    assert all(tuned[key] == value for key, value in ENVS["tuned"].items())
    monkeypatch.setitem(bench.ALLOCATOR, "env", "default")
    default = bench._env()
    assert not set(ENVS["tuned"]) & set(default)
    assert default["OMP_NUM_THREADS"] == str(bench.THREADS) and default["TOKENIZERS_PARALLELISM"] == "false"
