"""SpanBERT against the paper (Joshi et al. 2020), where no HF model is there to compare with: the SBO's
formula and inputs end to end, its shared output embedding, the masked share wherever the texts are
short or split by separators (the FLOP count charges the SBO at `rate`), and single segments, no NSP."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import lmforge
from lmforge.objectives import IGNORE, SpanMLM, registry

MASK, CLS, SEP = 3, 1, 2


def _objective(tied: bool = True, **kw) -> SpanMLM:
    torch.manual_seed(0)
    cfg = lmforge.tiny("bert-base").replace(tie_embeddings=tied)
    return SpanMLM(lmforge.build(cfg), mask_id=MASK, special_ids=(CLS, SEP), **kw)


def _texts(n: int, T: int, doc: int, seed: int = 0) -> list:
    """n examples of T tokens: [CLS], documents of 1..2*doc-1 pieces (30 % continuations) split by [SEP]."""
    gen, out = torch.Generator().manual_seed(seed), []
    for _ in range(n):
        ids, starts = [CLS], [True]
        while len(ids) < T - 1:
            k = min(int(torch.randint(1, 2 * doc, (), generator=gen)), T - 1 - len(ids))
            ids += torch.randint(5, 99, (k,), generator=gen).tolist()
            starts += [True] + (torch.rand(k - 1, generator=gen) >= 0.3).tolist()
            if len(ids) < T - 1:
                ids, starts = ids + [SEP], starts + [True]
        out.append({"input_ids": ids + [SEP], "word_starts": starts + [True]})
    return out


def _by_hand(head, left, right, pos, table):
    """Eq. 1-2 written out: h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}], two GeLU + LayerNorm layers, the table."""
    h0 = torch.cat([left, right, head.positions.weight[pos - 1]], dim=-1)
    h1 = F.layer_norm(F.gelu(h0 @ head.W1.weight.T + head.W1.bias), head.norm1.normalized_shape,
                      head.norm1.weight, head.norm1.bias, head.norm1.eps)
    y = F.layer_norm(F.gelu(h1 @ head.W2.weight.T + head.W2.bias), head.norm2.normalized_shape,
                     head.norm2.weight, head.norm2.bias, head.norm2.eps)
    return y @ table.T + head.bias


def test_loss_is_mlm_plus_sbo_read_from_each_spans_boundary_states_end_to_end():
    objective = _objective().eval()
    examples = _texts(3, 40, 12, seed=4)
    out = [objective.corrupt(e, torch.Generator().manual_seed(i)) for i, e in enumerate(examples)]
    batch = objective.collate(out)
    hidden = objective.model(batch["input_ids"], batch["attention_mask"], run_heads=False).last_hidden_state
    left, right, pos, target = [], [], [], []
    for b, example in enumerate(out):  # the boundaries found from the labels alone, not from span_left/right
        labelled = [i for i, label in enumerate(example["labels"]) if label != IGNORE]
        for i in labelled:
            s = i
            while s - 1 in labelled:
                s -= 1
            e = i
            while e + 1 in labelled:
                e += 1
            left.append(hidden[b, s - 1]), right.append(hidden[b, e + 1])
            pos.append(i - s + 1), target.append(example["labels"][i])
    logits = _by_hand(objective.sbo, torch.stack(left), torch.stack(right), torch.tensor(pos),
                      objective.model.tokens.weight)
    sbo = F.cross_entropy(logits, torch.tensor(target))
    mlm = objective.mlm_loss(hidden, batch["labels"]).loss
    loss = objective(batch)
    assert len(target) >= 10
    torch.testing.assert_close(loss.metrics["sbo_loss"], sbo)
    # per masked token L_MLM + L_SBO (sec. 3.2), averaged: the two means summed
    torch.testing.assert_close(loss.loss, mlm + sbo)


def test_sbo_predicts_with_the_mlms_output_embedding_when_it_is_untied():
    objective = _objective(tied=False).eval()
    decoder = objective.lm.decoder.weight
    assert decoder is not objective.model.tokens.weight
    hidden = torch.randn(1, 6, objective.model.config.d_model)
    batch = {"labels": torch.tensor([[IGNORE, 7, 8, IGNORE, IGNORE, IGNORE]]),
             "span_left": torch.tensor([[0, 0, 0, 0, 0, 0]]),
             "span_right": torch.tensor([[0, 3, 3, 0, 0, 0]]),
             "span_pos": torch.tensor([[0, 1, 2, 0, 0, 0]])}
    logits = _by_hand(objective.sbo, hidden[0, [0, 0]], hidden[0, [3, 3]], torch.tensor([1, 2]), decoder)
    loss, _ = objective.sbo_loss(hidden, batch)
    torch.testing.assert_close(loss, F.cross_entropy(logits, torch.tensor([7, 8])))
    loss.backward()  # the SBO trains the table the MLM predicts with, not the input table alone
    assert decoder.grad is not None and objective.model.tokens.weight.grad is None


def test_masked_share_is_the_rate_in_short_texts_and_between_documents():
    # the FLOP count charges the SBO (and the LM head) at rate x the maskable tokens: the spans must
    # select that share however short the text or its documents (BERT's ceil would give 25 % at 8
    # tokens, keeping the span that crosses the budget whole ~17-19 %)
    objective = _objective()
    for T, doc, n in ((10, 3, 4000), (16, 30, 2500), (64, 3, 800), (64, 12, 800), (130, 40, 400)):
        selected = maskable = 0
        for i, example in enumerate(_texts(n, T, doc, seed=T + doc)):
            out = objective.corrupt(example, torch.Generator().manual_seed(i))
            maskable += sum(t not in (CLS, SEP) for t in example["input_ids"])
            selected += sum(label != IGNORE for label in out["labels"])
        assert maskable >= 25_000
        assert abs(selected / maskable - 0.15) < 0.006, (T, doc, selected / maskable)


def test_spans_never_cross_a_separator_and_start_and_end_on_word_boundaries():
    objective = _objective()
    for i, example in enumerate(_texts(300, 64, 6, seed=9)):
        ids, starts = example["input_ids"], example["word_starts"]
        out = objective.corrupt(example, torch.Generator().manual_seed(i))
        for s, e, p, label in zip(out["span_left"], out["span_right"], out["span_pos"], out["labels"]):
            if label == IGNORE:
                continue
            s, e = s + 1, e - 1
            assert starts[s] and starts[e + 1] and SEP not in ids[s:e + 1] and CLS not in ids[s:e + 1]


def test_single_segments_and_no_next_sentence_prediction():
    spec = registry.get("span")
    assert spec.examples.kind == "sentences" and spec.examples.word_starts  # FULL-SENTENCES, one segment
    assert registry.get("spanbert") is spec
    objective = _objective()
    assert set(objective.heads()) == {"lm"}  # no pooler or NSP classifier is trained
    example = _texts(1, 40, 12)[0]
    batch = objective.collate([objective.corrupt(example, torch.Generator().manual_seed(0))])
    assert "segment_ids" not in batch and set(objective(batch).metrics) == {
        "mlm_accuracy", "mlm_loss", "sbo_loss", "sbo_accuracy"}
