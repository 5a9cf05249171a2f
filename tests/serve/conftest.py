"""Tiny saved models (with tokenizers) and real `lmforge serve` processes on 127.0.0.1 for the tests.

Each server is a subprocess started with --port 0 (it prints the port it bound) and is stopped by
the fixture's finalizer: SIGTERM, then SIGKILL if it has not exited within a few seconds.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

import lmforge
from lmforge.heads import attach
from lmforge.tasks.finetune import TaskConfig, make_task, save_model
from lmforge.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [f"the {a} {b} sat on the {c} near {d} river today" for a in ("small", "large", "red", "old", "quick")
         for b in ("cat", "dog", "bird", "fox") for c in ("mat", "hill", "road") for d in ("a", "the", "one")]
START = "import sys; from lmforge.cli import main; sys.exit(main(sys.argv[1:]))"


def _tokenizer(family: str):
    kind = {"bert": "wordpiece", "t5": "unigram"}.get(family, "bpe")
    return train_tokenizer(TEXTS, kind, 200, family=family)


def _save(model, tokenizer, path: Path) -> Path:
    model.save(path)
    tokenizer.save(path)
    return path


def _tiny(preset: str, tokenizer, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return lmforge.build(lmforge.tiny(preset, vocab_size=tokenizer.vocab_size, **overrides)).eval()


def _task(kind: str, labels, tokenizer, path: Path, seed: int) -> Path:
    model = _tiny("bert-base", tokenizer, seed, max_seq_len=128)
    torch.manual_seed(seed)
    task = make_task(kind, model, tokenizer, [], TaskConfig(max_len=64 if kind != "qa" else 48), labels)
    return save_model(task, path)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict:
    """name -> directory: an MLM encoder, a decoder, T5, and fine-tuned cls / tagging / qa models."""
    root = tmp_path_factory.mktemp("serve-models")
    bert, gpt, t5 = _tokenizer("bert"), _tokenizer("gpt2"), _tokenizer("t5")
    enc = _tiny("bert-base", bert, max_seq_len=128)
    attach(enc, "lm")
    gen = _tiny("gpt2", gpt, 1, max_seq_len=2048, d_model=64)
    attach(gen, "lm")
    seq = _tiny("t5-small", t5, 2, max_seq_len=128)
    attach(seq, "lm")
    return {"enc": _save(enc, bert, root / "enc"), "gen": _save(gen, gpt, root / "gen"),
            "t5": _save(seq, t5, root / "t5"),
            "cls": _task("cls", ["neg", "pos"], bert, root / "cls", 3),
            "tag": _task("tagging", ["B-X", "I-X", "O"], bert, root / "tag", 4),
            "qa": _task("qa", None, bert, root / "qa", 5)}


class Served:
    """A running server process: its base URL, and how to stop it."""

    def __init__(self, proc: subprocess.Popen, url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def client(self, **kw) -> httpx.Client:
        """An HTTP client of this server."""
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 30.0), **kw)

    def stop(self, grace: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after `grace` seconds; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc.stdout.close()
        return self.proc.returncode


def start_server(model_dirs: dict, names: tuple, log: Path, *options: str, wait: float = 60.0) -> Served:
    """`lmforge serve` on a free port of 127.0.0.1 with the models `names`; returns once /health answers."""
    argv = [sys.executable, "-c", START, "serve", "--host", "127.0.0.1", "--port", "0", "--threads", "1",
            *[arg for n in names for arg in ("--model", f"{n}={model_dirs[n]}")], *options]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with open(log, "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT, env=env)
    served = Served(proc, "", log)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], wait)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("lmforge serve: http://"):
            raise RuntimeError(f"server did not start: {line!r}\n{log.read_text()[-2000:]}")
        served.url = line.split()[2]
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                if httpx.get(served.url + "/health", timeout=2).status_code == 200:
                    return served
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"server never answered /health\n{log.read_text()[-2000:]}")
    except BaseException:
        served.stop(2)
        raise


@pytest.fixture(scope="session")
def embed_dirs(tmp_path_factory) -> dict:
    """name -> directory: two encoders of 32 positions for test_embed_options, plain (prompts by name in its
    config_sentence_transformers.json) and calibrated (int8 ranges saved beside it, whole and at 16 dims)."""
    from lmforge.pipelines.embed import SentenceEncoder
    from lmforge.pipelines.embed_options import EmbedOptions, save_ranges

    root = tmp_path_factory.mktemp("embed-models")
    tokenizer = _tokenizer("bert")
    plain = _save(_tiny("bert-base", tokenizer, 7, max_seq_len=32), tokenizer, root / "plain")
    (plain / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}))
    calibrated = _save(_tiny("bert-base", tokenizer, 8, max_seq_len=32), tokenizer, root / "calibrated")
    encoder = SentenceEncoder.from_dir(calibrated)
    for options in (EmbedOptions(), EmbedOptions(dimensions=16)):
        save_ranges(calibrated, encoder.embed_with(TEXTS, options).vectors, options)
    return {"plain": plain, "calibrated": calibrated}


@pytest.fixture(scope="session")
def server(model_dirs, embed_dirs, tmp_path_factory):
    """The main server: every test model (test_embed_options' two encoders last: no request naming no
    model gets one of them), a small batch budget so that requests are split and batched; the default body
    and cost limits otherwise, and its log at info (test_hardening reads its cancellations)."""
    served = start_server({**model_dirs, **embed_dirs},
                          ("enc", "gen", "t5", "cls", "tag", "qa", "plain", "calibrated"),
                          tmp_path_factory.mktemp("logs") / "main.log", "--max-batch-tokens", "256",
                          "--max-batch-items", "16", "--batch-wait-ms", "5", "--max-new-tokens", "2000",
                          "--log-level", "info")
    yield served
    served.stop()


@pytest.fixture(scope="session")
def tight(model_dirs, tmp_path_factory):
    """A server with small limits: queue of 8 requests, batches of 4 texts, 2 kB bodies; two workers of
    one thread each, so its floods are batched by both."""
    served = start_server(model_dirs, ("enc", "gen"), tmp_path_factory.mktemp("logs") / "tight.log",
                          "--threads", "2", "--workers", "2",
                          "--max-queue", "8", "--max-batch-items", "4", "--max-body-bytes", "2000",
                          "--max-request-tokens", "300", "--max-new-tokens", "50", "--max-top-k", "10")
    yield served
    served.stop()


@pytest.fixture(scope="session")
def ranked_dirs(tmp_path_factory) -> dict:
    """name -> directory: a reranker (rr: a cross-encoder of max_len 24) and a plain encoder (plain: no
    rerank head), for test_rerank and test_page."""
    root = tmp_path_factory.mktemp("rerank-models")
    tokenizer = _tokenizer("bert")
    model = _tiny("bert-base", tokenizer, 7, max_seq_len=128)
    torch.manual_seed(7)
    task = make_task("rerank", model, tokenizer, [], TaskConfig(max_len=24))
    return {"rr": save_model(task, root / "rr"),
            "plain": _save(_tiny("bert-base", tokenizer, 8, max_seq_len=128), tokenizer, root / "plain")}


@pytest.fixture(scope="session")
def ranked(ranked_dirs, tmp_path_factory):
    """A server of the reranker and the plain encoder: at most 8 documents and 170 tokens a request, 3
    items a batch (so that a request's documents are split into jobs and batched)."""
    served = start_server(ranked_dirs, ("rr", "plain"), tmp_path_factory.mktemp("logs") / "rerank.log",
                          "--max-documents", "8", "--max-batch-items", "3", "--max-request-tokens", "170")
    yield served
    served.stop()


def _hf_bert(tokenizer):
    import transformers

    cfg = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=3,
                                  num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    return transformers.BertModel(cfg)


def _hf_roberta(tokenizer):
    import transformers

    cfg = transformers.RobertaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, type_vocab_size=1,
                                     pad_token_id=tokenizer.pad_id,
                                     max_position_embeddings=64 + tokenizer.pad_id + 1)  # HF's offset
    return transformers.RobertaModel(cfg, add_pooling_layer=False)


def _hf_electra(tokenizer):
    import transformers

    cfg = transformers.ElectraConfig(vocab_size=tokenizer.vocab_size, embedding_size=16, hidden_size=32,
                                     num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=64)
    return transformers.ElectraModel(cfg)


def _hf_t5(tokenizer):
    import transformers

    cfg = transformers.T5Config(vocab_size=tokenizer.vocab_size, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                num_heads=4, relative_attention_num_buckets=8,
                                relative_attention_max_distance=16,
                                pad_token_id=tokenizer.pad_id, eos_token_id=tokenizer.eos_id,
                                decoder_start_token_id=tokenizer.pad_id)
    return transformers.T5EncoderModel(cfg)


# name: (tokenizer family, the tiny Hugging Face model, its seed); bert first, the server's default model
HF_FEATURES = {"bert": ("bert", _hf_bert, 0), "roberta": ("roberta", _hf_roberta, 0),
               "electra": ("bert", _hf_electra, 1), "t5": ("t5", _hf_t5, 2)}


@pytest.fixture(scope="session")
def feature_models(tmp_path_factory) -> dict:
    """name -> (directory, the reference): tiny Hugging Face checkpoints (BERT of 3 layers, RoBERTa,
    ELECTRA, T5's encoder; the reference HF's model) and an ELMo directory (the reference lmforge's own),
    for test_features and test_features_families."""
    pytest.importorskip("transformers")
    root, out = tmp_path_factory.mktemp("feature-models"), {}
    for name, (family, make, seed) in HF_FEATURES.items():
        tokenizer = _tokenizer(family)
        torch.manual_seed(seed)
        reference = make(tokenizer).eval()
        reference.save_pretrained(root / name)
        tokenizer.save(root / name)
        out[name] = root / name, reference
    torch.manual_seed(3)
    elmo = lmforge.build(lmforge.tiny("elmo-small")).eval()
    lmforge.save(elmo, root / "elmo")
    out["elmo"] = root / "elmo", elmo
    return out


@pytest.fixture(scope="session")
def featured(feature_models, tmp_path_factory):
    """One server of every feature model (bert first: the default model of a request naming none), at most
    2 layers and 20000 feature values a request."""
    served = start_server({n: m[0] for n, m in feature_models.items()}, tuple(feature_models),
                          tmp_path_factory.mktemp("logs") / "features.log", "--max-layers", "2",
                          "--max-feature-values", "20000")
    yield served
    served.stop()


@pytest.fixture(scope="session")
def local(model_dirs):
    """A TestClient of the app in this process on the MLM encoder and the decoder (one worker): for what a
    test changes inside the server (monkeypatch) or reads from its state."""
    from fastapi.testclient import TestClient

    from lmforge.serve import create_app, load_served

    app = create_app({name: load_served(name, model_dirs[name]) for name in ("enc", "gen")}, threads=1)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def tiny_embedder(tmp_path_factory):
    """(model directory, a TestClient of the app in this process serving it as "embed"): a seeded tiny BERT
    of 32 positions, for tests that compare the server's answers with the Python API's on one model."""
    from fastapi.testclient import TestClient

    from lmforge.serve import create_app, load_served

    tokenizer = _tokenizer("bert")
    path = _save(_tiny("bert-base", tokenizer, 7, max_seq_len=32), tokenizer,
                 tmp_path_factory.mktemp("tiny") / "embed")
    with TestClient(create_app({"embed": load_served("embed", path)}, threads=1)) as client:
        yield path, client
