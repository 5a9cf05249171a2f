"""The exact inner-product index: passage embeddings in a memory-mapped .npy file plus a JSON
manifest, searched with one matmul per batch of queries and a top-k (Maximum Inner Product Search,
as DPR's exact FAISS IndexFlatIP; Karpukhin et al. 2020, sec. 5.2).

An index directory holds:
- embeddings.npy: float32 (count, dim), read with mmap (pages come from disk as needed);
- ids.json: the passage ids, row by row;
- manifest.json: format, model, dim, count, pooling, the encoder's fingerprint (dpr.BiEncoder.fingerprint),
  its tokenizer's (dpr.BiEncoder.tokenizer_fingerprint),
  the encoder options its vectors were made with (pooling, normalize, max_length: queries are embedded
  with them too), and the sha256 of both files.

Never pickle: numpy reads the .npy with allow_pickle=False. A missing file, a truncated or altered
embeddings file, or a manifest that does not match is refused with a one-line ValueError.
With `faiss-cpu` installed, backend="faiss" searches the same vectors with faiss.IndexFlatIP. Either
backend ranks tied scores (duplicate passages) lower row first, as a stable brute-force sort does.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch

from lmforge.retrieval.index_dir import IndexDamaged, read_manifest
from lmforge.retrieval.job_options import BACKENDS
from lmforge.utils import jsontext
from lmforge.utils.atomic import atomic_write_text, replace_dir
from lmforge.utils.checksum import check_files, sha256
from lmforge.utils.progress import Bar

FORMAT = "lmforge-dense-index"
MAX_SCORES = 1 << 26  # float32 query-passage scores a search holds at once (256 MiB)


def write_index(path, ids: list, encode, dim: int, model: str = "", pooling: str = "", batch_size: int = 64,
                progress: bool = True, encoder: str = "", options: dict | None = None,
                tokenizer: str = "") -> Path:
    """Encode rows batch by batch into path/embeddings.npy (`encode(positions) -> (b, dim)` float
    array or tensor) with a progress bar, then ids.json and the manifest; `options`: how the encoder made
    its vectors (queries are embedded the same way). All in a fresh folder that then replaces `path` whole
    (utils.atomic.replace_dir): an interrupted build leaves `path` as it was, and a link at `path` is
    replaced, never written through."""
    path = Path(path)

    def write(folder: Path) -> None:
        _write_rows(folder / "embeddings.npy", len(ids), encode, dim, batch_size, progress)
        atomic_write_text(folder / "ids.json", json.dumps([str(i) for i in ids]))
        manifest = {"format": FORMAT, "version": 1, "model": str(model), "pooling": pooling, "dim": dim,
                    "encoder": encoder, "tokenizer": tokenizer, "count": len(ids), "dtype": "float32",
                    "options": dict(options or {}),
                    "sha256": {name: sha256(folder / name) for name in ("embeddings.npy", "ids.json")}}
        atomic_write_text(folder / "manifest.json", json.dumps(manifest, indent=2))

    replace_dir(path, write)
    return path


def _write_rows(file: Path, count: int, encode, dim: int, batch_size: int, progress: bool) -> None:
    """The (count, dim) float32 rows of encode(positions), batch by batch, into a new .npy `file`."""
    rows = np.lib.format.open_memmap(file, mode="w+", dtype=np.float32, shape=(count, dim))
    bar = Bar(count, "index", progress)
    try:
        for start in range(0, count, batch_size):
            block = encode(range(start, min(start + batch_size, count)))
            block = block.detach().cpu().numpy() if isinstance(block, torch.Tensor) else np.asarray(block)
            rows[start:start + len(block)] = block  # (b, dim)
            bar.update(start + len(block))
        rows.flush()
    finally:
        bar.close()
        del rows


def _manifest(path: Path) -> dict:
    """The dense part's manifest.json (index_dir.read_manifest's rules), with its vectors' width."""
    manifest = read_manifest(path / "manifest.json", FORMAT, "an lmforge dense index manifest")
    if not isinstance(manifest.get("dim"), int) or isinstance(manifest["dim"], bool) or manifest["dim"] < 1:
        raise IndexDamaged(f"{path / 'manifest.json'}: field 'dim' missing or not a width")
    return manifest


def _check_files(path: Path, manifest: dict, verify: bool) -> None:
    """Both files there and, where `verify`, matching the manifest's checksums."""
    names = ("embeddings.npy", "ids.json")
    missing = [name for name in names if not (path / name).is_file()]
    if missing or verify:
        check_files(path, {name: (manifest.get("sha256") or {}).get(name) for name in missing or names},
                    path / "manifest.json", IndexDamaged)


def best_first(values: torch.Tensor, positions: torch.Tensor, k: int) -> tuple:
    """The k best of (Q, c) candidate scores and positions, ordered by score, then by position: ties go to
    the lower position, as a stable sort of every score orders them. The candidates must hold every tie of
    each row's k-th score (top_k and the faiss search make sure)."""
    by_position = torch.sort(positions, dim=1).indices
    values, positions = values.gather(1, by_position), positions.gather(1, by_position)
    order = torch.sort(values, dim=1, descending=True, stable=True).indices[:, :k]
    return values.gather(1, order), positions.gather(1, order)


def top_k(scores: torch.Tensor, k: int) -> tuple:
    """((Q, k) values, (Q, k) positions) of each row's k highest scores, ties to the lower position
    (torch.topk alone leaves tied rows in an order of its own: duplicate passages, which ids a top k holds
    at a tied boundary, would change with the backend or the build)."""
    if k == 0 or scores.shape[0] == 0 or k >= scores.shape[1]:
        top = torch.topk(scores, k, dim=1)
        return top if k == 0 or scores.shape[0] == 0 else best_first(top.values, top.indices, k)
    top = torch.topk(scores, k + 1, dim=1)  # one more: whether a tie crosses the k-th place
    if bool((top.values[:, k] < top.values[:, k - 1]).all()):  # the usual case (a NaN fails it too)
        return best_first(top.values[:, :k], top.indices[:, :k], k)
    kth = top.values[:, k - 1:k]
    width = max(k, int((scores >= kth).sum(1).max()))  # every score tied with a k-th one is a candidate
    top = torch.topk(scores, width, dim=1)
    return best_first(top.values, top.indices, k)


def top_inner_products(queries: torch.Tensor, passages: torch.Tensor, k: int, batch_size: int = 256) -> tuple:
    """((Q, k) scores, (Q, k) passage positions) of each query's k highest inner products, best first, ties
    to the lower position (top_k): one matrix product per batch of queries, so a (batch, N) score matrix is
    the most held at once, the batch cut so that it holds at most MAX_SCORES scores."""
    k = min(k, len(passages))
    # the score matrix is batch x passages: 256 queries against DPR's 21M passages would be 21 GB
    batch_size = max(1, min(batch_size, MAX_SCORES // max(1, len(passages))))
    scores, positions = [], []
    for start in range(0, len(queries), batch_size):
        values, indices = top_k(queries[start:start + batch_size] @ passages.T, k)
        scores.append(values)
        positions.append(indices)
    if not scores:
        return torch.empty(0, k), torch.empty(0, k, dtype=torch.long)
    return torch.cat(scores), torch.cat(positions)


class DenseIndex:
    """Passage embeddings (count, dim) and their ids; search(queries, k) -> (scores, positions)."""

    def __init__(self, embeddings, ids: list, manifest: dict | None = None) -> None:
        self.embeddings = embeddings  # (N, d) numpy array or memmap
        self.ids = list(ids)
        self.manifest = manifest or {}
        with warnings.catch_warnings():  # a read-only memmap: torch warns, and the tensor is never written
            warnings.simplefilter("ignore", UserWarning)
            self.matrix = torch.from_numpy(np.asarray(embeddings, dtype=np.float32))  # (N, d), shares memory
        self._faiss = None

    @property
    def dim(self) -> int:
        """Embedding width."""
        return self.matrix.shape[1]

    @classmethod
    def load(cls, path: str | os.PathLike, verify: bool = True) -> "DenseIndex":
        """Open an index directory, embeddings memory-mapped; refuses a damaged one in one line."""
        path = Path(path)
        manifest = _manifest(path)
        _check_files(path, manifest, verify)
        try:
            rows = np.load(path / "embeddings.npy", mmap_mode="r", allow_pickle=False)
        except ValueError as err:  # truncated: numpy cannot map the rows the header promises
            raise IndexDamaged(f"{path / 'embeddings.npy'}: truncated or not a .npy array ({err})") from None
        if rows.shape != (manifest["count"], manifest["dim"]) or rows.dtype != np.float32:
            raise IndexDamaged(f"{path / 'embeddings.npy'}: shape {rows.shape} {rows.dtype} does not match "
                               f"the manifest ({manifest['count']}, {manifest['dim']}) float32")
        ids = jsontext.loads((path / "ids.json").read_text(encoding="utf-8"))
        if len(ids) != manifest["count"]:
            raise IndexDamaged(f"{path / 'ids.json'}: {len(ids)} ids for {manifest['count']} rows")
        return cls(rows, ids, manifest)

    def check_encoder(self, width: int, fingerprint: str, name: str, tokenizer: str = "") -> None:
        """Refuse a query encoder other than the one the index was built with (another width, or, where
        the manifest has them, another fingerprint or tokenizer): its inner products would rank nonsense."""
        built = self.manifest.get("model") or "its model"
        if width != self.dim:
            raise ValueError(f"the dense index was built by {built} ({self.dim}-wide vectors); the query "
                             f"encoder {name} gives {width}-wide ones: query with the index's model")
        if self.manifest.get("encoder") and fingerprint != self.manifest["encoder"]:
            raise ValueError(f"the dense index was built by {built} (encoder {self.manifest['encoder']}); "
                             f"the query encoder {name} is another model (encoder {fingerprint}): query "
                             "with the index's model")
        if self.manifest.get("tokenizer") and tokenizer != self.manifest["tokenizer"]:
            raise ValueError(f"the dense index was built by {built} "
                             f"(tokenizer {self.manifest['tokenizer']}); "
                             f"the query encoder {name} reads texts with another tokenizer "
                             f"({tokenizer or 'unknown'}): query with the index's model and its tokenizer")

    def search(self, queries, k: int, batch_size: int = 256, backend: str = "torch") -> tuple:
        """((Q, k) scores, (Q, k) row positions) of the highest inner products, best first."""
        q = torch.as_tensor(queries, dtype=torch.float32)
        # a reshape would cut wider rows into several queries
        if q.ndim not in (1, 2) or q.shape[-1] != self.dim:
            raise ValueError(f"queries of shape {tuple(q.shape)}: the index holds {self.dim}-wide vectors")
        q = q.reshape(-1, self.dim)  # (Q, d)
        k = min(k, len(self.ids))
        if backend == "faiss":
            return self._faiss_search(q, k)
        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
        return top_inner_products(q, self.matrix, k, batch_size)

    def _faiss_search(self, q: torch.Tensor, k: int) -> tuple:
        try:
            import faiss
        except ImportError:
            raise ValueError("backend faiss needs the faiss-cpu package (pip install faiss-cpu)") from None
        if self._faiss is None:
            self._faiss = faiss.IndexFlatIP(self.dim)
            self._faiss.add(np.ascontiguousarray(self.matrix.numpy()))
        rows, n = np.ascontiguousarray(q.numpy()), len(self.ids)
        width = min(n, k + 1)
        while True:  # widen until every row's last candidate scores below its k-th: all its ties are in
            scores, positions = self._faiss.search(rows, width)
            if width == n or k == 0 or (scores[:, -1] < scores[:, k - 1]).all():
                break
            width = min(n, 2 * width)
        return best_first(torch.from_numpy(scores), torch.from_numpy(positions).long(), k)
