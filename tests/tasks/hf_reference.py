"""Shared by test_reference.py and test_reference_cross_encoders.py: a tiny random Hugging Face checkpoint,
its logits of TEXTS and evaluate's predictions of them (the tests importorskip transformers)."""
import json

import torch

from lmforge.tasks.finetune import evaluate
from tests.tasks.core import tokenizer

TEXTS = ["a good film", "a bad film", "the plot was dull", "great acting and a fine story"]


def reference_dir(path, architecture="BertForSequenceClassification", **config):
    """A tiny random reference checkpoint saved by save_pretrained, with an lmforge tokenizer."""
    import transformers

    tok = tokenizer()
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                                  **config)
    model = getattr(transformers, architecture)(cfg).eval()
    model.save_pretrained(path)
    tok.save(path)
    return model, path


def reference_logits(model):
    """The reference's logits of each text, one at a time (no padding), on lmforge's token ids."""
    with torch.no_grad():
        return [model(torch.tensor([tokenizer().encode(t, None, max_length=128).ids])).logits[0]
                for t in TEXTS]


def predictions(path, kind, tmp_path):
    """evaluate's predictions of TEXTS (as unlabelled cls records) by the model directory `path`."""
    out = tmp_path / "predictions.jsonl"
    evaluate(path, [{"text": t} for t in TEXTS], kind, out=out)
    return [json.loads(line)["prediction"] for line in out.read_text().splitlines()]
