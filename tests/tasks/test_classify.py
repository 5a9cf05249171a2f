"""Sequence-level tasks: golden encodings, heads per architecture, losses, batch prediction, export."""
import json

import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError
from lmforge.tasks import task_class
from lmforge.tasks.classify import shift_right
from lmforge.tasks.fields import Records
from lmforge.tasks.finetune import TaskConfig, make_task
from lmforge.tokenizer import train_tokenizer
from tests.tasks.core import sentiment, tiny, tokenizer

PRESETS = {"bert-base": "bert", "gpt2": "gpt2", "bart-base": "roberta"}


def pieces(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def test_single_and_pair_encodings_are_bert_templates():
    tok = tokenizer("bert")
    task = task_class("pair")(tiny(), tok, labels=["0", "1"])
    (ex,) = task.encode({"text": "It is superb.", "text_pair": "I like it.", "label": "1"})
    a, b = pieces(tok, "It is superb."), pieces(tok, "I like it.")
    assert ex["input_ids"] == [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
    assert ex["segment_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    assert ex["label"] == 1
    single = task_class("cls")(tiny(), tok, labels=["neg", "pos"])
    (ex,) = single.encode({"text": "It is superb.", "label": "neg"})
    assert ex == {"input_ids": [tok.cls_id, *a, tok.sep_id], "segment_ids": [0] * (len(a) + 2), "label": 0}


def test_truncation_and_unknown_label():
    tok = tokenizer("bert")
    task = task_class("cls")(tiny(), tok, labels=["0", "1"], max_len=6)
    (ex,) = task.encode({"text": "I bought the camera last year and it works perfectly.", "label": "0"})
    assert len(ex["input_ids"]) == 6 and ex["input_ids"][-1] == tok.sep_id
    with pytest.raises(ValueError, match="line 7: label 'maybe'"):
        task.encode({"text": "x", "label": "maybe", "line": 7})


@pytest.mark.parametrize("kind", ["cls", "pair"])
def test_a_classifier_of_one_label_is_refused(kind):
    """A softmax over one output is 1 for every input (cross-entropy 0, nothing learned), and its head exports
    as num_labels 1, which the reference reads as a regression."""
    one = [{"text": "good film", "text_pair": "yes", "label": "pos"}] * 2
    with pytest.raises(ValueError, match=f"task '{kind}' needs two labels at least, got only 'pos'"):
        make_task(kind, tiny(), tokenizer(), one, TaskConfig())
    two = [*one, {"text": "bad film", "text_pair": "no", "label": "neg"}]
    assert make_task(kind, tiny(), tokenizer(), two, TaskConfig()).task_head.spec["n_labels"] == 2


def test_decoder_encoding_has_no_segments_and_regression_label_is_float():
    tok = tokenizer("gpt2")
    task = task_class("regression")(tiny("gpt2"), tok)
    (ex,) = task.encode({"text": "It is superb.", "text_pair": None, "label": 3})
    assert ex == {"input_ids": pieces(tok, "It is superb."), "label": 3.0}
    batch = task.collate(task.encode_all([{"text": "a b", "label": 1.5}, {"text": "a", "label": -2.0}]))
    assert batch["label"].dtype == torch.float and batch["label"].tolist() == [1.5, -2.0]
    assert "record" not in batch and batch["attention_mask"].tolist() == [[1, 1], [1, 0]]


def test_choice_batches_flatten_choices_and_mask_missing_ones():
    tok = tokenizer("bert")
    task = task_class("choice")(tiny(), tok)
    records = [{"text": "He sat", "choices": ["down.", "up.", "on it."], "label": 2},
               {"text": "She ran", "choices": ["away.", "fast."], "label": 0}]
    batch = task.collate(task.encode_all(records))
    assert batch["input_ids"].shape[0] == 6  # (B x C) with C = 3
    assert batch["choice_mask"].tolist() == [[True, True, True], [True, True, False]]
    first = [tok.cls_id, *pieces(tok, "He sat"), tok.sep_id, *pieces(tok, "down."), tok.sep_id]
    assert batch["input_ids"][0, :len(first)].tolist() == first
    probs = task.predict(batch)
    assert [len(p) for p in probs] == [3, 2] and all(abs(sum(p) - 1) < 1e-5 for p in probs)
    loss = task(batch).loss
    assert torch.isfinite(loss)


def test_multilabel_encodes_a_label_set_trains_with_mean_bce_and_predicts_labels_over_the_threshold():
    task = task_class("multilabel")(tiny(), tokenizer(), labels=["a", "b", "c"], threshold=0.3).eval()
    records = [{"text": "It is superb.", "label": ["c", "a"]}, {"text": "It broke.", "label": []}]
    examples = task.encode_all(records)
    assert [e["label"] for e in examples] == [[1, 0, 1], [0, 0, 0]]
    batch = task.collate(examples)
    want = torch.nn.BCEWithLogitsLoss()(task.scores(batch), torch.tensor([[1.0, 0, 1], [0, 0, 0]]))
    torch.testing.assert_close(task(batch).loss, want)  # the reference's loss: mean over labels and examples
    probs = [[0.9, 0.31, 0.3], [0.1, 0.2, 0.29]]
    assert task.decode(records, examples, probs) == [["a", "b"], []]  # strictly above the threshold
    with pytest.raises(ValueError, match=r"^line 4: label 'd' is not one of the training labels \['a', 'b'"):
        task.encode({"text": "x", "label": ["a", "d"], "line": 4})
    found = task_class("multilabel").labels_from([{"label": ["b"]}, {"label": []}, {"label": ["a", "b"]}])
    assert found == ["a", "b"]


def test_multilabel_fine_tune_lowers_the_loss_and_predicts_a_label_list_per_record(tmp_path):
    from lmforge.tasks.finetune import TaskConfig, evaluate, finetune
    from lmforge.train import TrainConfig

    records = [{"text": r["text"], "label": ["pos"] * (r["label"] == "1") + ["long"] * (len(r["text"]) > 40)}
               for r in sentiment()["train"][:32]]
    finetune(tiny(n_layers=1, n_heads=2), tokenizer(), "multilabel", records, None, tmp_path,
             TrainConfig(steps=12, batch_size=32, lr=3e-3, warmup=0, schedule="constant", log_every=1,
                         progress=False),
             TaskConfig(max_len=32, threshold=0.4), log=lambda *a: None)
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert losses[-1] < losses[0] * 0.9
    assert json.loads((tmp_path / "final" / "task.json").read_text())["threshold"] == 0.4
    out = tmp_path / "predictions.jsonl"
    metrics = evaluate(tmp_path / "final", records[:8], out=out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert list(metrics) == ["micro_f1", "macro_f1", "subset_accuracy"] and len(rows) == 8
    assert all(isinstance(r["prediction"], list) and set(r["prediction"]) <= {"long", "pos"} for r in rows)


def test_shift_right():
    assert shift_right(torch.tensor([[5, 6, 7]]), 2).tolist() == [[2, 5, 6]]


@pytest.mark.parametrize("preset", PRESETS)
def test_heads_per_architecture(preset):
    task = task_class("cls")(tiny(preset), tokenizer(PRESETS[preset]), labels=["a", "b", "c"])
    spec = task.model.heads["classification"].spec
    expected = {"bert-base": {"pooling": "first", "pooler": True},
                "gpt2": {"pooling": "last", "pooler": False, "bias": False},
                "bart-base": {"pooling": "last", "pooler": True}}[preset]
    assert spec == {"kind": "classification", "n_labels": 3, **expected}
    assert list(task.model.heads) == ["classification"]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("kind", ["cls", "regression", "choice", "multilabel"])
def test_every_kind_trains_and_predicts_in_batches(preset, kind):
    tok = tokenizer(PRESETS[preset])
    records = {"cls": [{"text": "It is superb.", "label": "1"}, {"text": "It broke.", "label": "0"},
                       {"text": "I want my money back now.", "label": "0"}],
               "regression": [{"text": "It is superb.", "text_pair": "Great.", "label": 4.5},
                              {"text": "It broke.", "label": 0.5},
                              {"text": "Fine, I guess so.", "label": 2.0}],
               "choice": [{"text": "It is", "choices": ["superb.", "bad."], "label": 0},
                          {"text": "I want", "choices": ["it.", "my money back.", "more."], "label": 1},
                          {"text": "Ok", "choices": ["yes.", "no."], "label": 1}],
               "multilabel": [{"text": "It is superb.", "label": ["good", "short"]},
                              {"text": "It broke.", "label": []},
                              {"text": "I want my money back now.", "label": ["bad"]}]}[kind]
    cls = task_class(kind)
    task = cls(tiny(preset), tok, labels=cls.labels_from(records)).eval()
    loss = task(task.collate(task.encode_all(records))).loss
    loss.backward()
    assert torch.isfinite(loss) and task.task_head.classifier.weight.grad is not None
    together = task.outputs(task.encode_all(records), batch_size=8)
    alone = [task.outputs(task.encode_all([r]))[0] for r in records]
    # padding in a batch changes nothing
    assert torch.allclose(torch.tensor(sum(map(_flat, together), [])),
                          torch.tensor(sum(map(_flat, alone), [])), atol=1e-5)
    predictions, metrics = task.evaluate(records)
    assert len(predictions) == 3 and list(metrics)[0] in ("accuracy", "pearson", "micro_f1")


def _flat(x):
    return list(x) if isinstance(x, list) else [x]


def test_pretrained_pooler_is_reused_and_other_heads_dropped():
    model = tiny()
    lmforge.heads.attach(model, "lm")
    pooler = lmforge.heads.attach(model, "pooler")
    task = task_class("cls")(model, tokenizer(), labels=["0", "1"])
    assert list(model.heads) == ["classification"]
    assert torch.equal(task.task_head.pooler.dense.weight, pooler.dense.weight)


def test_fine_tuned_head_is_kept_when_it_fits():
    model = tiny()
    first = task_class("cls")(model, tokenizer(), labels=["0", "1"]).task_head
    assert task_class("pair")(model, tokenizer(), labels=["0", "1"]).task_head is first
    assert task_class("cls")(model, tokenizer(), labels=["a", "b", "c"]).task_head is not first


def test_bert_classifier_exports_as_bert_for_sequence_classification(tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = tokenizer()
    task = task_class("cls")(tiny(), tok, labels=["0", "1", "2"]).eval()
    records = [{"text": "It is superb."}, {"text": "I want my money back."}]
    batch = task.collate(task.encode_all(records))
    ours = task.scores(batch)
    task.model.save(tmp_path, format="hf")
    ref = transformers.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        theirs = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     token_type_ids=batch["segment_ids"]).logits
    assert ref.config.architectures == ["BertForSequenceClassification"]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_bart_classifier_matches_bart_for_sequence_classification(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = tiny("bart-base", pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    task = task_class("cls")(model, tokenizer("roberta"), labels=["0", "1", "2"]).eval()
    batch = task.collate(task.encode_all([{"text": "It is superb."}, {"text": "I want my money back."}]))
    ours = task.scores(batch)
    model.save(tmp_path, format="hf")
    ref = transformers.BartForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():  # the reference shifts the ids right itself and pools at each row's last eos
        theirs = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_gpt2_classifier_exports_as_gpt2_for_sequence_classification(tmp_path):
    transformers = pytest.importorskip("transformers")
    task = task_class("cls")(tiny("gpt2"), tokenizer("gpt2"), labels=["0", "1", "2"]).eval()
    assert task.model.config.pad_token_id == task.pad_id  # the reference finds the last real token by it
    batch = task.collate(task.encode_all([{"text": "It is superb."}, {"text": "I want my money back, now."}]))
    assert not batch["attention_mask"].all()  # right padding: the first row's score is not at the end
    ours = task.scores(batch)
    task.model.save(tmp_path, format="hf")
    ref = transformers.GPT2ForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        theirs = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert ref.config.architectures == ["GPT2ForSequenceClassification"]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


CHOICE_TEXTS = [f"the {a} {b} sat on the {c}" for a in ("small", "red", "old") for b in ("cat", "dog")
                for c in ("mat", "hill")]


def test_choice_records_are_batched_with_records_of_as_many_choices():
    """MultipleChoiceTask.outputs runs records of as many choices together (collate pads each record to
    its batch's most choices), for evaluate and the server alike; the scores are each record's alone."""
    tokenizer = train_tokenizer(CHOICE_TEXTS, "wordpiece", 120, family="bert")
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base", vocab_size=tokenizer.vocab_size)).eval()
    task = make_task("choice", model, tokenizer, [], TaskConfig(max_len=32))
    records = [{"text": CHOICE_TEXTS[0], "choices": (CHOICE_TEXTS * 4)[:40 if i == 1 else 2]}
               for i in range(4)]
    examples = task.encode_all(records)
    seen, collate = [], task.collate
    task.collate = lambda batch: seen.append([len(e["choices"]) for e in batch]) or collate(batch)
    found = task.outputs(examples, batch_size=len(examples))  # as predict_batch runs a batch
    assert all(len(set(sizes)) == 1 for sizes in seen) and sorted(map(len, seen)) == [1, 3]
    alone = [task.outputs([e])[0] for e in examples]  # each record's scores as if it were batched alone
    assert [len(f) for f in found] == [2, 40, 2, 2]
    for got, want in zip(found, alone):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)


def test_an_xlnet_classifier_pools_its_closing_cls_as_the_reference_and_exports(tmp_path):
    """XLNet's <cls> ends its text; the task pooled the first token (a word) and the export was refused."""
    transformers = pytest.importorskip("transformers")

    model = lmforge.build(lmforge.tiny("xlnet-base", vocab_size=tokenizer("bert").vocab_size))
    task = task_class("cls")(model, tokenizer("bert"), labels=["a", "b"])
    assert task.model.heads["classification"].spec["pooling"] == "last"
    task.model.save(tmp_path / "hf", format="hf")
    reference = transformers.XLNetForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 8, 10]])  # the rows differ at the last token alone
    with torch.no_grad():
        ours, theirs = task.model.eval()(ids).head_outputs["classification"], reference(ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(ours[0], ours[1])  # the last token is what is read


def test_an_xlnet_classifier_fine_tuned_on_its_first_token_keeps_its_head():
    """A head saved before XLNet pooled its last token had been replaced by a fresh one (evaluate then
    refused the folder as never fine-tuned, and a continued fine-tuning dropped the trained head)."""
    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("xlnet-base", vocab_size=tokenizer("bert").vocab_size))
    attach(model, "classification", n_labels=2, pooling="first")
    trained = model.heads["classification"]
    task = task_class("cls")(model, tokenizer("bert"), labels=["a", "b"])
    assert task.model.heads["classification"] is trained


def test_a_sigmoid_regression_trains_bce_on_the_logit_and_refuses_labels_outside_0_1():
    """sentence-transformers trains a one-output CrossEncoder by BCE with logits on labels in [0, 1] and
    scores sigmoid(logit); lmforge trained MSE on the raw logit whatever its activation. Identity keeps
    MSE."""
    import torch.nn.functional as F

    records = [{"text": "It is superb.", "text_pair": "Great.", "label": 0.9},
               {"text": "It is dull.", "text_pair": "Great.", "label": 0.2}]
    losses = {}
    for activation in ("sigmoid", "identity"):
        task = make_task("regression", tiny(), tokenizer(), records, TaskConfig(activation=activation)).eval()
        batch = task.collate(task.encode_all(records))
        with torch.no_grad():  # eval: no dropout, the same logits twice
            logits, labels = task.scores(batch).squeeze(-1), torch.tensor([0.9, 0.2])
            losses[activation] = (float(task(batch).loss), float(F.mse_loss(logits, labels)),
                                  float(F.binary_cross_entropy_with_logits(logits, labels)))
    assert losses["sigmoid"][0] == pytest.approx(losses["sigmoid"][2])
    assert losses["identity"][0] == pytest.approx(losses["identity"][1])
    sigmoid = make_task("regression", tiny(), tokenizer(), records, TaskConfig(activation="sigmoid"))
    with pytest.raises(ValueError, match=r"line 7: label 4.5 is outside \[0, 1\].*activation=sigmoid"):
        sigmoid.check_trainable([{"text": "a", "label": 4.5, "line": 7}])
    identity = make_task("regression", tiny(), tokenizer(), records, TaskConfig())
    identity.check_trainable([{"text": "a", "label": 4.5}])


def test_a_sigmoid_regression_evaluates_gold_on_any_scale_and_refuses_it_only_for_training(tmp_path):
    """An STS CrossEncoder's sigmoid scores against STS-B gold on 0-5 (Spearman is scale-free) were refused
    by encode; only a run's training and validation records are, naming the file and line."""
    from lmforge.tasks.finetune import encode_split, evaluate, save_model

    task = make_task("regression", tiny(), tokenizer(), [], TaskConfig(activation="sigmoid"))
    save_model(task, tmp_path / "sts")
    gold = [{"text": t, "text_pair": "a film", "label": v}
            for t, v in (("good", 4.5), ("bad", 0.5), ("ok", 3))]
    metrics = evaluate(tmp_path / "sts", gold, out=tmp_path / "predictions.jsonl")
    assert set(metrics) >= {"pearson", "spearman", "mse"}
    scores = [json.loads(line)["prediction"] for line in (tmp_path / "predictions.jsonl").open()]
    assert all(0 < s < 1 for s in scores)  # through the sigmoid
    for source, field in (("training", "train"), ("validation", "validation")):
        with pytest.raises(OptionsError,
                           match=rf"{source}: line 1: label 4.5 is outside .*activation=sigmoid") as err:
            encode_split(task, Records([{**gold[0], "line": 1}], field=field), source, trained=source)
        assert err.value.field == field  # Python's records: the argument they came in (Records.field)
    from lmforge.tasks.finetune import finetune
    from lmforge.train import TrainConfig

    with pytest.raises(OptionsError, match=r"^train: line 1: label 4.5 is outside") as err:  # through the job
        finetune(tiny(), tokenizer(), "regression", gold[:1], None, tmp_path / "o", TrainConfig(steps=1),
                 TaskConfig(activation="sigmoid"))
    assert err.value.field == "train"
    # the caller says whether records are trained on, not the split's display name
    assert len(encode_split(task, [{**gold[0], "line": 1}], "training")) == 1
    with pytest.raises(OptionsError, match=r"held out: line 1: label 4.5 is outside") as err:
        encode_split(task, [{**gold[0], "line": 1}], "held out", trained="training")
    assert err.value.field is None  # a plain list remembers no argument


def test_fine_tuning_a_cross_encoder_folder_as_regression_trains_what_it_scores(tmp_path):
    """Its activation (sigmoid: the CrossEncoder default) is the run's unless given, so the loss is BCE and
    the saved task.json reads the score as the folder did; labels past 1 are refused before any step."""
    from lmforge.tasks.finetune import finetune
    from lmforge.train import TrainConfig
    from tests.tasks.hf_reference import reference_dir

    _, path = reference_dir(tmp_path / "ce", num_labels=1, sentence_transformers={"activation_fn": None})
    train = [{"text": t, "text_pair": "a film", "label": i / 4} for i, t in enumerate(["good", "bad", "ok"])]
    cfg = TrainConfig(steps=2, batch_size=2, lr=1e-3, seed=0, log_every=100)
    finetune(path, None, "regression", train, None, tmp_path / "run", cfg, log=lambda *a: None)
    assert json.loads((tmp_path / "run" / "final" / "task.json").read_text())["activation"] == "sigmoid"
    with pytest.raises(ValueError, match=r"train: line 1: label 4 is outside \[0, 1\]"):
        finetune(path, None, "regression", [{**train[0], "label": 4}], None, tmp_path / "bad", cfg)
    finetune(path, None, "regression", [{**train[0], "label": 4}], None, tmp_path / "mse", cfg,
             TaskConfig(activation="identity"), log=lambda *a: None)
