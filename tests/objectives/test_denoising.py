import json
import math
from collections import Counter

import pytest
import torch

import lmforge
from lmforge.objectives import Denoising
from lmforge.objectives.denoising import (NOISES, document_rotation, infilling_spans, make_noise, sentences,
                                          text_infilling)
from lmforge.train import Trainer

from tests.objectives.test_mlm import seed_outcomes
from tests.objectives.test_prefix_lm import counting
from tests.parity.helpers import transformers
from tests.train.helpers import quick

BOS, PAD, EOS, MASK, STOP = 0, 1, 2, 4, 5  # RoBERTa/BART's <s> <pad> </s> <unk> <mask>, then "."
TEXT = "the cat sat . a dog ran home . birds fly over the river . it rained .".split()
VOCAB = {"<s>": BOS, "</s>": EOS, "<mask>": MASK, ".": STOP}
for _w in TEXT:
    VOCAB.setdefault(_w, len(VOCAB) + 2)
WORDS = {v: k for k, v in VOCAB.items()}
TOKENS = [VOCAB[w] for w in TEXT]


def _noised(name, seed=0, tokens=TOKENS):
    out = make_noise(name, mask_id=MASK, sentence_end=STOP)(tokens, torch.Generator().manual_seed(seed))
    return " ".join(WORDS[t] for t in out)


GOLDEN = {
    "token-masking": "the cat <mask> . a dog ran home . <mask> fly over the <mask> . it rained .",
    "token-deletion": "the cat . a dog ran home . fly over the . it rained .",
    "text-infilling": "the cat sat . a dog ran <mask> . birds fly <mask> the river <mask> it <mask>",
    "sentence-permutation": "the cat sat . a dog ran home . it rained . birds fly over the river .",
    "document-rotation": ". birds fly over the river . it rained . the cat sat . a dog ran home",
}


@pytest.mark.parametrize("name", NOISES)
def test_golden_example_per_noise(name):
    assert _noised(name) == GOLDEN[name]


def test_text_infilling_zero_length_span_inserts_a_mask():
    assert infilling_spans(len(TOKENS), torch.Generator().manual_seed(2)) == [0, 5]
    # the zero-length span adds a <mask> before "a"; the 5-token span becomes one <mask>
    assert _noised("text-infilling", seed=2) == "the cat sat . <mask> a dog ran <mask> the river . " \
        "it rained ."


def test_text_infilling_statistics_over_100k_tokens():
    removed = total = 0
    lengths = []
    for seed in range(10):  # long texts: the stopping rule biases only the last span of each
        tokens = [10 + i % 90 for i in range(10_000)]
        spans = infilling_spans(len(tokens), torch.Generator().manual_seed(seed))
        out = text_infilling(tokens, torch.Generator().manual_seed(seed), mask_id=MASK)
        assert out.count(MASK) == len(spans)  # one mask per span, zero-length ones included
        removed += len(tokens) - (len(out) - out.count(MASK))
        total += len(tokens)
        lengths += spans[:-1]  # the last one is cut to fit the budget
    assert total >= 100_000
    assert abs(removed / total - 0.30) < 0.002  # 30 % of the tokens are masked
    counts, n = Counter(lengths), len(lengths)
    assert n > 9000 and abs(sum(lengths) / n - 3.0) < 0.06  # Poisson(3): mean 3
    for k in range(7):  # the empirical distribution is Poisson(3)'s, zero-length spans (5 %) included
        assert abs(counts[k] / n - math.exp(-3) * 3 ** k / math.factorial(k)) < 0.012


def test_masking_and_deletion_rates_and_permutation_orders():
    tokens = list(range(10, 110))
    masked = sum(make_noise("token-masking", mask_id=MASK)(tokens,
                                                           torch.Generator().manual_seed(s)).count(MASK)
                 for s in range(500))
    kept = sum(len(make_noise("token-deletion")(tokens, torch.Generator().manual_seed(s)))
               for s in range(500))
    assert abs(masked / 50_000 - 0.15) < 0.002 and abs(1 - kept / 50_000 - 0.15) < 0.002
    three = [1, 2, STOP, 3, STOP, 4, 4, STOP]
    assert sentences(three, STOP) == [[1, 2, STOP], [3, STOP], [4, 4, STOP]]
    assert sentences([1, STOP, 2], STOP) == [[1, STOP], [2]]  # a trailing sentence without its stop
    permute = make_noise("sentence-permutation", sentence_end=STOP)
    orders = Counter(tuple(permute(three, torch.Generator().manual_seed(s))) for s in range(600))
    assert len(orders) == 6 and min(orders.values()) > 60  # all 3! orders, about evenly
    rotations = {tuple(document_rotation(tokens, torch.Generator().manual_seed(s))) for s in range(1000)}
    assert len(rotations) == 100 and \
        all(r[r.index(10):] + r[:r.index(10)] == tuple(tokens) for r in rotations)


def _objective(**kw):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bart-base"), decoder_start_token_id=EOS, pad_token_id=PAD)
    return Denoising(model, MASK, sentence_end=STOP, ends=(BOS, EOS), pad_id=PAD, **kw)


def test_corruption_keeps_the_ends_and_targets_the_original():
    objective = _objective()  # default: sentence permutation, then text infilling
    example = {"input_ids": [BOS, *TOKENS, EOS]}
    out = objective.corrupt(example, torch.Generator().manual_seed(0))
    assert out["labels"] == example["input_ids"]
    assert out["input_ids"][0] == BOS and out["input_ids"][-1] == EOS and MASK in out["input_ids"]
    # composition: names and callables in the order given
    reverse = Denoising(objective.model, MASK, noises=[lambda t, g: t[::-1], "document-rotation"],
                        ends=(BOS, EOS), pad_id=PAD)
    rotated = reverse.corrupt(example, torch.Generator().manual_seed(1))["input_ids"][1:-1]
    assert rotated == document_rotation(TOKENS[::-1], torch.Generator().manual_seed(1))
    for bad, match in [(dict(noises=["shuffle"]), "^noises=.*at least one of"),
                       (dict(noises=[]), "at least one"),
                       (dict(sentence_end=None), "sentence-end")]:
        with pytest.raises(ValueError, match=match):
            Denoising(objective.model, MASK, **{"sentence_end": STOP, **bad})
    with pytest.raises(ValueError, match="mask"):
        make_noise("text-infilling")


def test_teacher_forced_loss_equals_the_reference_bart(tmp_path):
    objective = _objective()
    examples = [objective.corrupt({"input_ids": [BOS, *TOKENS[:n], EOS]}, torch.Generator().manual_seed(n))
                for n in (18, 9)]
    batch = objective.collate(examples)
    assert batch["decoder_input_ids"][0, :3].tolist() == [EOS, BOS, TOKENS[0]]  # BART starts with </s>
    assert batch["decoder_input_ids"][1, -1] == PAD
    objective.finish().save(tmp_path, format="hf")
    reference = transformers.BartForConditionalGeneration.from_pretrained(tmp_path).eval()
    objective.eval()
    with torch.no_grad():
        ours = objective(batch).loss
        theirs = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           labels=batch["labels"]).loss
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_denoising_trains_bart(tmp_path):
    objective = _objective(noises=("text-infilling", "document-rotation"))
    data = [{"input_ids": [BOS, *e["input_ids"], EOS]} for e in counting()]
    model = Trainer(objective, data, quick(steps=30, lr=1e-2, warmup=3), tmp_path).fit()
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(losses[-3:]) / 3 < 0.6 * sum(losses[:3]) / 3
    assert list(model.heads) == ["lm"]


def test_a_seed_fixes_every_draw_and_different_seeds_noise_differently():
    objective = _objective()
    example = {"input_ids": [BOS, *TOKENS, *TOKENS, EOS]}
    assert len(set(seed_outcomes(objective.corrupt, example))) == 20
