"""The exact inner-product index: the same top-k as a brute-force sort, reloaded memory-mapped without
pickle, and a truncated / altered / mismatched one refused in one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmforge.retrieval.index import DenseIndex, top_k, write_index


def _build(tmp_path, n=300, d=16, seed=0):
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, d)).astype(np.float32)
    path = write_index(tmp_path / "ix", [f"p{i}" for i in range(n)], lambda rows: vectors[list(rows)], d,
                       model="random", batch_size=64, progress=False)
    return path, vectors


def test_search_is_exact_topk_and_reload_is_memory_mapped(tmp_path):
    path, vectors = _build(tmp_path)
    index = DenseIndex.load(path)
    assert isinstance(index.embeddings, np.memmap)
    queries = np.random.default_rng(1).standard_normal((7, 16)).astype(np.float32)
    scores, positions = index.search(queries, k=5, batch_size=3)
    want = np.argsort(-(queries @ vectors.T), axis=1)[:, :5]
    assert np.array_equal(positions.numpy(), want)
    assert torch.allclose(scores, torch.from_numpy(np.take_along_axis(queries @ vectors.T, want, 1)),
                          atol=1e-5)
    manifest = json.loads((path / "manifest.json").read_text())
    assert (manifest["dim"], manifest["count"], manifest["model"]) == (16, 300, "random")
    assert len(manifest["sha256"]["embeddings.npy"]) == 64
    assert not list(path.glob("*.pkl"))


def test_faiss_flat_ip_agrees_with_the_matmul(tmp_path):
    pytest.importorskip("faiss")
    path, _ = _build(tmp_path)
    index = DenseIndex.load(path)
    queries = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    assert torch.equal(index.search(queries, 10, backend="faiss")[1], index.search(queries, 10)[1])


def test_a_truncated_index_is_refused_in_one_line(tmp_path):
    path, _ = _build(tmp_path)
    data = (path / "embeddings.npy").read_bytes()
    (path / "embeddings.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"embeddings.npy: checksum does not match") as err:
        DenseIndex.load(path)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"embeddings.npy: truncated"):
        DenseIndex.load(path, verify=False)


def test_an_altered_or_incomplete_index_is_refused(tmp_path):
    path, _ = _build(tmp_path)
    rows = np.load(path / "embeddings.npy", mmap_mode="r+")
    rows[3, 2] += 1.0
    rows.flush()
    del rows
    with pytest.raises(ValueError, match=r"checksum does not match"):
        DenseIndex.load(path)
    (path / "manifest.json").write_text("{")
    with pytest.raises(ValueError, match=r"manifest.json: missing or not JSON"):
        DenseIndex.load(path)
    (path / "manifest.json").unlink()
    with pytest.raises(ValueError, match=r"manifest.json: missing or not JSON"):
        DenseIndex.load(path)


def test_a_manifest_that_does_not_match_the_rows_is_refused(tmp_path):
    path, _ = _build(tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "count": 299}))
    with pytest.raises(ValueError, match=r"does not match the manifest \(299, 16\)"):
        DenseIndex.load(path)


def test_top_inner_products_in_batches_equal_one_product():
    from lmforge.retrieval.index import top_inner_products

    torch.manual_seed(0)
    queries, passages = torch.randn(7, 16), torch.randn(40, 16)
    whole = torch.topk(queries @ passages.T, 5, dim=1)
    scores, positions = top_inner_products(queries, passages, 5, batch_size=3)  # batches of 3, 3 and 1
    assert torch.equal(positions, whole.indices) and torch.allclose(scores, whole.values)
    assert top_inner_products(queries, passages, 99)[1].shape == (7, 40)  # k beyond the passages: all of them
    empty = top_inner_products(torch.zeros(0, 16), passages, 5)
    assert empty[0].shape == (0, 5) and empty[1].dtype == torch.long


def test_a_link_at_the_index_folder_is_replaced_never_written_through(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("keep")
    (tmp_path / "ix").symlink_to(target, target_is_directory=True)
    path, _ = _build(tmp_path)
    assert path.is_dir() and not path.is_symlink() and DenseIndex.load(path).embeddings.shape == (300, 16)
    assert [p.name for p in target.iterdir()] == ["keep"] and (target / "keep").read_text() == "keep"


def test_a_build_that_fails_midway_leaves_the_earlier_index_whole(tmp_path):
    path, vectors = _build(tmp_path)
    before = {p.name: p.read_bytes() for p in path.iterdir()}

    def encode(rows):
        if rows.start >= 128:
            raise OSError(28, "No space left on device")
        return vectors[list(rows)]

    with pytest.raises(OSError, match="No space left"):
        write_index(path, [f"q{i}" for i in range(300)], encode, 16, batch_size=64, progress=False)
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["ix"]  # no half-written folder beside it
    DenseIndex.load(path)


def _tied(tmp_path):
    """An index of small-integer vectors (exact inner products) with duplicate rows, so that many scores
    tie, some at the k-th place; and the brute-force order: score, then the lower row first."""
    g = torch.Generator().manual_seed(0)
    vectors = torch.randint(-2, 3, (48, 8), generator=g).float()
    vectors[17] = vectors[30] = vectors[5]
    vectors[44] = vectors[2]
    queries = torch.randint(-2, 3, (6, 8), generator=g).float()
    path = write_index(tmp_path / "ix", [f"p{i}" for i in range(48)], lambda rows: vectors[list(rows)], 8,
                       batch_size=7, progress=False)
    scores = (queries @ vectors.T).numpy()
    want = np.array([sorted(range(48), key=lambda j: (-row[j], j))[:10] for row in scores])
    return DenseIndex.load(path), queries, want, np.take_along_axis(scores, want, 1)


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_ties_rank_the_lower_row_first_as_a_stable_brute_force_sort(tmp_path, backend):
    if backend == "faiss":
        pytest.importorskip("faiss")
    index, queries, want, want_scores = _tied(tmp_path)
    scores, positions = index.search(queries, 10, batch_size=4, backend=backend)
    assert np.array_equal(positions.numpy(), want)  # torch.topk / faiss alone: another tied row at the 10th
    assert np.array_equal(scores.numpy(), want_scores)


def test_top_k_returns_k_columns_whatever_the_scores():
    scores = torch.tensor([[1.0, float("nan"), 3.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    values, positions = top_k(scores, 2)
    assert positions.tolist() == [[1, 2], [0, 1]]  # torch.topk's NaN-first order; all-tied: the lower rows


def test_a_query_tokenizer_other_than_the_indexs_is_refused_where_the_manifest_records_one(tmp_path):
    rng = np.random.default_rng(0)
    path = write_index(tmp_path / "ix", ["a", "b"], lambda rows: rng.standard_normal((len(rows), 4)), 4,
                       model="m", encoder="e" * 16, tokenizer="t" * 16, progress=False)
    index = DenseIndex.load(path)
    index.check_encoder(4, "e" * 16, "m", "t" * 16)
    with pytest.raises(ValueError, match="another tokenizer"):
        index.check_encoder(4, "e" * 16, "other", "u" * 16)
    old = DenseIndex(index.embeddings, index.ids, {**index.manifest, "tokenizer": ""})  # built before
    old.check_encoder(4, "e" * 16, "other", "u" * 16)


def test_a_search_holds_at_most_max_scores_at_once_and_ranks_as_one_product(monkeypatch):
    import lmforge.retrieval.index as index

    torch.manual_seed(0)
    queries, passages = torch.randn(9, 8), torch.randn(50, 8)
    whole = index.top_inner_products(queries, passages, 4)
    seen, real = [], index.top_k
    monkeypatch.setattr(index, "MAX_SCORES", 120)  # two queries' scores: batches of 2 whatever is asked
    monkeypatch.setattr(index, "top_k", lambda scores, k: seen.append(scores.numel()) or real(scores, k))
    scores, positions = index.top_inner_products(queries, passages, 4, batch_size=256)
    assert max(seen) <= 120 and len(seen) == 5
    assert torch.equal(positions, whole[1]) and torch.allclose(scores, whole[0])
    monkeypatch.setattr(index, "MAX_SCORES", 10)  # fewer than one query's: still one at a time
    assert torch.equal(index.top_inner_products(queries, passages, 4)[1], whole[1])
