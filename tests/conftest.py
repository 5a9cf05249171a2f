"""Shared helpers: tiny models of every preset and inputs that fit them."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# `make test` runs the suite in parallel workers (pytest-xdist): each takes an equal share of the cores,
# for itself and the commands it starts, so that two workers never make torch threads wait on a busy core
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))

import torch  # noqa: E402  (after the thread share: torch reads OMP_NUM_THREADS when it loads)

import lmforge
from lmforge.presets import PRESETS

# int8 kernel choices stay per process in tests (and in the commands they start): a file under the
# user's cache would carry one test run's choices into another (quant/kernel_store.py has its own tests)
os.environ.setdefault("LMFORGE_INT8_KERNELS", "off")
# the native kernel (quant/native.py) is built once per test run, beside the run's own files, not in the
# user's cache
if "LMFORGE_NATIVE" not in os.environ:
    os.environ["LMFORGE_NATIVE"] = tempfile.mkdtemp(prefix="lmforge-native-")
    atexit.register(shutil.rmtree, os.environ["LMFORGE_NATIVE"], True)

ALL_PRESETS = list(PRESETS)

# every value of every axis, on a tiny model of each architecture
_BASE = dict(vocab_size=99, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=64, window=8,
             block_size=4, linformer_k=16, relative_buckets=8, relative_max_distance=16)
_AXES = [
    *[dict(position=p) for p in ("learned", "sinusoidal", "relative-bias", "alibi", "rotary", "none")],
    dict(position="rotary", rotary_dim=4, rotary_theta=500.0),
    dict(position="learned", position_offset=2, scale_embeddings=True),
    dict(norm="rmsnorm"), dict(norm_bias=False), dict(norm_placement="pre"),
    dict(norm_placement="post", final_norm=True), dict(norm_placement="pre", final_norm=False),
    *[dict(ffn=f) for f in ("relu", "gelu", "gelu-tanh", "geglu", "geglu-tanh", "swiglu")],
    dict(ffn_bias=False, attention_bias=False, attention_scaling=False),
    dict(n_kv_heads=2), dict(n_kv_heads=1), dict(d_head=12),
    dict(d_embed=16), dict(share_layers=True), dict(tie_embeddings=False, lm_transform=False),
    dict(n_segments=0, embedding_norm=False),
    *[dict(attention=a) for a in ("sliding-window", "dilated", "longformer", "bigbird", "linformer")],
    dict(attention="dilated", dilation=2, window=4),
    dict(attention="longformer", global_projections=True, n_global_tokens=2),
    dict(n_layers=3, attention_schedule=["sliding-window", "sliding-window", "full"]),
    dict(position="xl-relative", n_segments=0),
]


def _axis_cases() -> dict:
    cases = {}
    for arch in ("encoder", "decoder", "encoder-decoder"):
        for axis in _AXES:
            try:
                cfg = lmforge.ModelConfig(**{**_BASE, "architecture": arch, **axis})
            except lmforge.ConfigError:
                continue  # a combination the config rejects (tested in test_config)
            cases[arch + ":" + ",".join(f"{k}={v}" for k, v in axis.items())] = cfg
    return cases


CASES = {**{name: lmforge.tiny(name) for name in ALL_PRESETS}, **_axis_cases()}


def tiny_model(name_or_cfg, **overrides) -> lmforge.Transformer:
    """A seeded, eval-mode tiny model of a preset (or of a ModelConfig)."""
    torch.manual_seed(0)
    cfg = name_or_cfg if isinstance(name_or_cfg, lmforge.ModelConfig) else lmforge.tiny(name_or_cfg)
    model = lmforge.build(cfg, **overrides)
    return model.eval()


def segments_for(cfg, ids: torch.Tensor):
    """Segment ids exercising every segment embedding (or XLNet's segment term), else None."""
    if cfg.n_segments >= 2 or cfg.position == "xl-relative":
        # independent of padding; on the ids' device (a GPU run's too)
        return (torch.arange(ids.shape[1], device=ids.device) >= 3).long().expand_as(ids)
    return None


def forward(model, ids, mask=None, decoder_ids=None, decoder_mask=None, **kw):
    """Run any architecture; returns the ModelOutput."""
    cfg = model.config
    if cfg.architecture == "encoder-decoder":
        decoder_ids = ids if decoder_ids is None else decoder_ids
        return model(ids, mask, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask, **kw)
    if cfg.architecture == "encoder":
        return model(ids, mask, segment_ids=segments_for(cfg, ids), **kw)
    return model(ids, mask, **kw)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture
def few_probes(monkeypatch):
    """Pretraining on the built-in corpus scores 800 cloze probes before and after (most of a tiny
    run's time): a test that does not read probes.json scores 8 (pytestmark usefixtures)."""
    import lmforge.train.pretrain as pretrain

    monkeypatch.setattr(pretrain, "PROBES_PER_KIND", 1)


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread avoids waiting on a busy second core (pytestmark usefixtures)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --- the end of a run says what was skipped and what installs it ---

# modules the suite imports-or-skips: the command that installs each (the dev extra holds most)
_INSTALL = {"faiss": "pip install faiss-cpu", "sacrebleu": "pip install sacrebleu",
            "rouge_score": "pip install rouge-score"}
_DEV = "pip install -e '.[dev]'"


def _skip_reason(report) -> str:
    """A skip's reason, with the command that installs a missing module (importorskip's reasons)."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if reason.startswith("could not import "):
        module = reason.split("'")[1].split(".")[0]
        return f"no {module} ({_INSTALL.get(module, _DEV)})"
    return reason


def pytest_terminal_summary(terminalreporter):
    """Group the skipped tests by reason, most first, so that a run says what it did not test."""
    reports = [r for r in terminalreporter.stats.get("skipped", []) if getattr(r, "when", "") != "teardown"]
    if not reports:
        return
    counts: dict = {}
    for report in reports:
        reason = _skip_reason(report)
        counts[reason] = counts.get(reason, 0) + 1
    terminalreporter.write_sep("-", f"{len(reports)} skipped")
    for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.write_line(f"{n} skipped: {reason}")
