import json

import pytest
import torch

import lmforge
from lmforge.layers.patterns import causal_mask, prefix_keys
from lmforge.layers.positions import ALiBi
from lmforge.objectives import IGNORE, EncoderDecoderPrefixLM, PrefixLM, prefix_lm
from lmforge.objectives.prefix_lm import split_point
from lmforge.train import Trainer

from tests.train.helpers import quick


def counting(n=64, seed=0):
    """Runs of 20-39 consecutive ids (mod 60): every continuation is predictable from its prefix."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length, start = (int(torch.randint(20, 40, (), generator=gen)),
                         int(torch.randint(60, (), generator=gen)))
        out.append({"input_ids": [5 + (start + i) % 60 for i in range(length)]})
    return out


def _decoder(name="gpt2", **kw):
    torch.manual_seed(0)
    return lmforge.build(lmforge.tiny(name, **kw)).eval()


def _visible(model, T, prefix_lengths):
    """(B, T, T) bool: which keys each query sees, read from the stack's attention bias."""
    x = torch.zeros(len(prefix_lengths), T, model.config.d_model)
    ctx = model.decoder.context(x, torch.arange(T)[None], 0, None,
                                prefix_lengths=torch.tensor(prefix_lengths))
    bias = ctx.biases["full"]  # (B, 1, T, T) additive
    return (bias == 0)[:, 0]


def test_prefix_mask_prefix_sees_whole_prefix_and_suffix_is_causal():
    T, P = 9, 4
    seen = _visible(_decoder(), T, [P, 0])
    for i in range(T):
        keys = {j for j in range(T) if seen[0, i, j]}
        # a prefix position sees the whole prefix and nothing after it; a suffix position sees
        # everything before it (and itself), nothing after
        assert keys == (set(range(P)) if i < P else set(range(i + 1)))
    assert torch.equal(seen[1], causal_mask(torch.arange(T), torch.arange(T))[0, 0])  # P = 0: causal
    assert prefix_keys(torch.arange(5), torch.tensor([2])).tolist() == [[[[True, True, False, False, False]]]]


@pytest.mark.parametrize("name", ["gpt2", "bloom-560m", "llama-3.2-1b"])  # learned, ALiBi, rotary
def test_prefix_outputs_depend_on_later_prefix_tokens_only(name):
    model, T, P = _decoder(name), 10, 6
    ids = torch.randint(5, 99, (1, T), generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([P])
    out = model(ids, prefix_lengths=lengths, run_heads=False).last_hidden_state
    later_suffix = ids.clone()
    later_suffix[0, 8] = (ids[0, 8] + 1) % 99
    out2 = model(later_suffix, prefix_lengths=lengths, run_heads=False).last_hidden_state
    torch.testing.assert_close(out[:, :8], out2[:, :8])  # the suffix stays causal
    in_prefix = ids.clone()
    in_prefix[0, 5] = (ids[0, 5] + 1) % 99
    out3 = model(in_prefix, prefix_lengths=lengths, run_heads=False).last_hidden_state
    assert (out3[0, 0] - out[0, 0]).abs().max() > 1e-4  # position 0 reads the whole prefix
    causal = model(ids, run_heads=False).last_hidden_state
    zero = model(ids, prefix_lengths=torch.tensor([0]), run_heads=False).last_hidden_state
    torch.testing.assert_close(zero, causal)


def test_alibi_of_a_decoder_penalises_later_prefix_keys_by_their_distance():
    bias = ALiBi(lmforge.tiny("bloom-560m"), bidirectional=False)(torch.arange(6), torch.arange(6))[0]
    torch.testing.assert_close(bias[:, 1, 4], bias[:, 4, 1])  # |i - j|, not a bonus for later keys
    assert (bias[:, 1, 4] < bias[:, 1, 2]).all()


def test_cached_decoding_after_a_prefix_equals_the_full_pass():
    model, P = _decoder(), 5
    ids = torch.randint(5, 99, (2, 9), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([P, P])
    full = model(ids, prefix_lengths=lengths, run_heads=False).last_hidden_state
    first = model(ids[:, :P], prefix_lengths=lengths, use_cache=True, run_heads=False)
    steps = [first.last_hidden_state]
    cache = first.cache
    for t in range(P, 9):
        out = model(ids[:, t:t + 1], prefix_lengths=lengths, cache=cache, run_heads=False)
        steps.append(out.last_hidden_state)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)


def test_prefix_lengths_are_checked():
    model = _decoder()
    with pytest.raises(ValueError, match="shape"):
        model(torch.ones(2, 4, dtype=torch.long), prefix_lengths=torch.tensor([1]))
    windowed = _decoder("gpt2", attention="sliding-window")
    with pytest.raises(ValueError, match="full attention"):
        windowed(torch.ones(1, 4, dtype=torch.long), prefix_lengths=torch.tensor([1]))


def test_corruption_labels_the_continuation_only():
    objective = PrefixLM(_decoder())
    ids = list(range(10, 20))
    out = objective.corrupt({"input_ids": ids}, torch.Generator().manual_seed(3))
    P = out["prefix_length"]
    assert 1 <= P <= 9 and out["input_ids"] == ids
    assert out["labels"] == [IGNORE] * (P - 1) + ids[P:] + [IGNORE]
    draws = [split_point(10, torch.Generator().manual_seed(s)) for s in range(2000)]
    assert set(draws) == set(range(1, 10))  # uniform over the 9 split points
    assert max(draws.count(p) for p in range(1, 10)) < 2000 / 9 * 1.3


def test_prefix_lm_trains_a_decoder(tmp_path):
    objective = prefix_lm(_decoder().train())
    assert isinstance(objective, PrefixLM)
    model = Trainer(objective, counting(), quick(steps=30, lr=1e-2, warmup=3), tmp_path).fit()
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3
    assert list(model.heads) == ["lm"]


def test_encoder_decoder_prefix_lm_is_the_source_target_split():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("t5-small"))
    objective = prefix_lm(model, pad_id=0, eos_id=1, decoder_start_id=0)
    assert isinstance(objective, EncoderDecoderPrefixLM)
    ids = list(range(10, 20))
    out = objective.corrupt({"input_ids": ids}, torch.Generator().manual_seed(3))
    P = len(out["input_ids"]) - 1
    assert out == {"input_ids": ids[:P] + [1], "labels": ids[P:] + [1]}
    batch = objective.collate([out])
    assert batch["decoder_input_ids"][0].tolist() == [0] + ids[P:]
    assert torch.isfinite(objective(batch).loss)
    with pytest.raises(ValueError, match="decoder"):
        PrefixLM(model)
