import json

import pytest
import torch

import lmforge
from lmforge.objectives import IGNORE, SpanCorruption
from lmforge.objectives.t5_span_corruption import (corrupt_spans, noise_counts, random_segmentation,
                                                random_spans_noise_mask, raw_length, sentinel_ids)
from lmforge.tokenizer import train_tokenizer
from lmforge.train import Trainer

from tests.objectives.test_mlm import seed_outcomes
from tests.objectives.test_prefix_lm import counting
from tests.parity.helpers import transformers
from tests.train.helpers import quick

EOS = 1
SENTINELS = [32099 - i for i in range(100)]  # T5's layout: <extra_id_0> is the last id of 32100
TEXT = ("Thank you for inviting me to your party last week . The food was wonderful and the music was "
        "even better . We stayed until midnight , talking with old friends about the years we spent "
        "together at school . I hope we can meet again soon .").split()
VOCAB = {w: 10 + i for i, w in enumerate(dict.fromkeys(TEXT))}
WORDS = {**{v: k for k, v in VOCAB.items()}, EOS: "</s>",
         **{s: f"<extra_id_{i}>" for i, s in enumerate(SENTINELS)}}


def _words(ids):
    return " ".join(WORDS[i] for i in ids)


def _objective(preset="t5-small", **kw):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny(preset))
    return SpanCorruption(model, [98 - i for i in range(20)], eos_id=EOS, decoder_start_id=0, **kw)


def test_golden_example_of_a_seeded_sentence():
    tokens = [VOCAB[w] for w in TEXT]  # 48 tokens: round(7.2) = 7 noise tokens in round(7/3) = 2 spans
    mask = random_spans_noise_mask(len(tokens), torch.Generator().manual_seed(2))
    inputs, targets = corrupt_spans(tokens, mask, SENTINELS, EOS)
    assert _words(inputs) == ("Thank you for inviting me <extra_id_0> your party last week . The food was "
                              "wonderful and the music was even better . We stayed until midnight , talking "
                              "with old friends about the years we spent together at school . I hope "
                              "<extra_id_1> </s>")
    assert _words(targets) == "<extra_id_0> to <extra_id_1> we can meet again soon . <extra_id_2> </s>"
    assert inputs[5] == 32099 and inputs[-2] == 32098 and targets[-2] == 32097  # descending ids
    # T5's code layout (no final sentinel): what its targets would be for the same mask
    _, code_targets = corrupt_spans(tokens, mask, SENTINELS, EOS, final_sentinel=False)
    assert _words(code_targets) == "<extra_id_0> to <extra_id_1> we can meet again soon . </s>"
    # the objective draws the same mask from the same generator
    out = _objective().corrupt({"input_ids": tokens}, torch.Generator().manual_seed(2))
    small = corrupt_spans(tokens, mask, [98 - i for i in range(20)], EOS)  # the objective's sentinels
    assert (out["input_ids"], out["labels"]) == small


def test_noise_counts_round_as_t5():
    # float32 products, ties to even: 10 x 0.15 = 1.50000006 -> 2; 7 / 3 -> 2; 77 / 3 -> 26
    assert [noise_counts(n, 0.15, 3.0) for n in (1, 2, 10, 48, 100, 512)] == [
        (1, 1), (1, 1), (2, 1), (7, 2), (15, 5), (77, 26)]
    # one span is always the text's end: non-noise first, noise last
    assert random_spans_noise_mask(20, torch.Generator().manual_seed(0)) == [False] * 17 + [True] * 3


def test_random_segmentation_is_uniform_over_cuts():
    counts = {}
    for seed in range(4000):
        lengths = tuple(random_segmentation(5, 2, torch.Generator().manual_seed(seed)))
        assert sum(lengths) == 5 and min(lengths) >= 1
        counts[lengths] = counts.get(lengths, 0) + 1
    assert sorted(counts) == [(1, 4), (2, 3), (3, 2), (4, 1)]
    assert all(abs(c / 4000 - 0.25) < 0.03 for c in counts.values())


def test_noise_statistics_over_100k_tokens():
    noise = total = spans = 0
    for seed in range(200):
        tokens = list(range(100, 612))
        mask = random_spans_noise_mask(len(tokens), torch.Generator().manual_seed(seed))
        assert not mask[0] and mask[-1]  # starts with kept tokens, ends with a noise span
        inputs, targets = corrupt_spans(tokens, mask, SENTINELS, EOS)
        n_spans = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
        assert (sum(mask), n_spans) == (77, 26)  # round(512 x 0.15), round(77 / 3)
        assert len(inputs) == 512 - 77 + 26 + 1 and len(targets) == 77 + 26 + 2
        noise += sum(mask)
        total += len(mask)
        spans += n_spans
    assert total >= 100_000
    assert abs(noise / total - 0.15) < 0.001  # 77 / 512 = 0.1504
    assert abs(noise / spans - 3.0) < 0.05  # 77 / 26 = 2.96


def test_input_and_target_restore_the_text():
    tokens = list(range(100, 300))
    mask = random_spans_noise_mask(len(tokens), torch.Generator().manual_seed(5))
    inputs, targets = corrupt_spans(tokens, mask, SENTINELS, EOS)
    spans, current = {}, None
    for t in targets[:-2]:  # without the final sentinel and </s>
        if t in SENTINELS:
            current = spans.setdefault(t, [])
        else:
            current.append(t)
    restored = [t for i in inputs[:-1] for t in (spans[i] if i in SENTINELS else [i])]
    assert restored == tokens


def test_sentinels_are_looked_up_through_a_t5_tokenizer():
    texts = ["the cat sat on the mat", "a dog ran in the park", "birds fly over the river"] * 20
    tok = train_tokenizer(texts, "unigram", 60, family="t5")
    ids = sentinel_ids(tok)
    assert ids[0] == tok.vocab_size - 1 and ids == list(range(tok.vocab_size - 1, tok.vocab_size - 101, -1))
    with pytest.raises(ValueError, match="extra_id"):
        sentinel_ids(train_tokenizer(texts, "wordpiece", 60, family="bert"))


def test_raw_length_is_t5s_random_spans_helper():
    # T5: inputs_length 512 takes 568 raw tokens, their targets 114 (+1: the paper's final sentinel here)
    n = raw_length(512)
    noise, spans = noise_counts(n, 0.15, 3.0)
    assert n == 568 and n - noise + spans + 1 == 512 and noise + spans + 1 == 114
    for inputs_length in range(2, 300):
        n = raw_length(inputs_length)
        grown = [m - noise_counts(m, 0.15, 3.0)[0] + noise_counts(m, 0.15, 3.0)[1] + 1 for m in (n, n + 1)]
        assert grown[0] <= inputs_length < grown[1]  # the most tokens that fit


def test_examples_concatenate_documents_and_targets_end_in_one_eos():
    # T5's reduce_concat_tokens runs documents together; a </s> joining them stood mid-target (39 % of
    # 512-token GCIDE blocks): the only </s> of an input or a target is its last token
    from lmforge import objectives
    from lmforge.data.stream import build_examples

    texts = ["the cat sat on the mat", "a dog ran in the park", "birds fly over the river"] * 20
    tok = train_tokenizer(texts, "unigram", 60, family="t5")
    docs = [[tok.encode(t, add_special_tokens=False).ids] for t in texts]
    eos = tok.special_id("eos")
    # the blocks are sized by the objective's own noise: at 0.05 the 0.15 blocks overfilled max_len
    for options in ({}, {"noise_density": 0.05, "mean_noise_span_length": 2.0}):
        examples = build_examples(objectives.get("span-corruption").examples, docs, tok, 24, options=options)
        model = lmforge.build(lmforge.tiny("t5-small"))
        objective = SpanCorruption(model, sentinel_ids(tok), eos, decoder_start_id=0, **options)
        for i, example in enumerate(examples):
            assert eos not in example["input_ids"]
            out = objective.corrupt(example, torch.Generator().manual_seed(i))
            assert len(out["input_ids"]) == 24  # T5's raw length: the corrupted input fills max_len
            for seq in (out["input_ids"], out["labels"]):
                assert seq.count(eos) == 1 and seq[-1] == eos


def test_teacher_forcing_batch_and_loss_equal_the_reference_t5(tmp_path):
    objective = _objective()
    examples = [objective.corrupt({"input_ids": list(range(5, 5 + n))}, torch.Generator().manual_seed(n))
                for n in (30, 45)]
    batch = objective.collate(examples)
    labels, dec = batch["labels"], batch["decoder_input_ids"]
    assert dec[:, 0].tolist() == [0, 0]  # T5's decoder starts with the pad id
    for row, e in enumerate(examples):
        n = len(e["labels"])
        assert dec[row, 1:n].tolist() == e["labels"][:-1] and labels[row, n:].eq(IGNORE).all()
        assert batch["decoder_attention_mask"][row].sum() == n
    objective.model.config = objective.model.config.replace(decoder_start_token_id=0, pad_token_id=0)
    objective.finish().save(tmp_path, format="hf")
    reference = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    objective.eval()
    with torch.no_grad():
        ours = objective(batch).loss
        theirs = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           labels=labels).loss
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_span_corruption_trains_an_encoder_decoder(tmp_path):
    objective = _objective("bart-base")
    model = Trainer(objective, counting(), quick(steps=30, lr=1e-2, warmup=3), tmp_path).fit()
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3
    assert list(model.heads) == ["lm"]
    with pytest.raises(ValueError, match="encoder-decoder"):
        SpanCorruption(lmforge.build(lmforge.tiny("gpt2")), SENTINELS, EOS)


def test_a_seed_fixes_every_draw_and_different_seeds_draw_different_spans():
    objective = _objective()
    assert len(set(seed_outcomes(objective.corrupt, {"input_ids": list(range(10, 70))}))) == 20


@pytest.mark.parametrize("final_sentinel", [True, False])
def test_lengths_follow_t5s_arithmetic_at_every_length(final_sentinel):
    objective = _objective(final_sentinel=final_sentinel)
    for length in range(2, 120):
        noise, spans = noise_counts(length, 0.15, 3.0)
        tokens = list(range(1000, 1000 + length))  # apart from the sentinels 98, 97, ...
        out = objective.corrupt({"input_ids": tokens}, torch.Generator().manual_seed(length))
        # T5's inputs: kept tokens, one sentinel a span, </s>; targets: a sentinel and its span each, </s>
        assert len(out["input_ids"]) == length - noise + spans + 1
        assert len(out["labels"]) == noise + spans + 1 + final_sentinel
        assert out["labels"][0] == 98 and out["labels"][-1] == EOS  # <extra_id_0> first, </s> last
        # descending
        assert [t for t in out["input_ids"] if t < 1000 and t != EOS] == list(range(98, 98 - spans, -1))
