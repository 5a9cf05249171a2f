"""--task seq2seq: source/target files, teacher-forced targets (and the `labels` key of Seq2SeqLM),
predictions equal to lmforge.generate's, BLEU / ROUGE equal to sacrebleu / rouge-score, and a tiny
T5 checkpoint of the reference library and a from-scratch transformer-base that train through the CLI."""
import functools
import json
import random

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.data.examples import source_target
from lmforge.objectives.base import IGNORE
from lmforge.objectives.seq2seq import Seq2SeqLM
from lmforge.tasks.finetune import TaskConfig, make_task
from lmforge.tasks.formats import read_task_file
from lmforge.tasks.seq2seq import Seq2SeqTask
from lmforge.tokenizer import train_tokenizer

sacrebleu = pytest.importorskip("sacrebleu")
rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")

WORDS = "red blue green black white pink gold grey cyan lime navy teal".split()
FAST = ["batch_size=8", "lr=1e-2", "warmup=0", "progress=false", "log_every=2", "max_new_tokens=12"]


def pairs(n: int, seed: int, reverse: bool = False) -> list:
    """(source, target) of a synthetic copy (or reverse) task: 4-6 colour words."""
    rng, out = random.Random(seed), []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 6))]
        out.append((" ".join(words), " ".join(reversed(words) if reverse else words)))
    return out


def jsonl(path, rows, source="source", target="target"):
    path.write_text("".join(json.dumps({source: s, target: t}) + "\n" for s, t in rows), encoding="utf-8")
    return str(path)


def csv(path, rows, header="source,target"):
    path.write_text(header + "\n" + "".join(f"{s},{t}\n" for s, t in rows), encoding="utf-8")
    return str(path)


@functools.lru_cache(maxsize=None)
def tokenizer(family: str = "roberta"):
    """A word-level BPE tokenizer of the colour words: T5's specials (<pad> 0, </s> 1; "x </s>") or
    RoBERTa's (<s> x </s>, as a from-scratch Transformer's BPE)."""
    return train_tokenizer([s for s, _ in pairs(200, 0)], "bpe", 80, family=family)


def transformer(seed: int = 0, **overrides):
    """A tiny model of the transformer-base preset (every axis kept) sized to the BPE tokenizer."""
    torch.manual_seed(seed)
    return lmforge.build(lmforge.tiny("transformer-base", vocab_size=tokenizer().vocab_size, **overrides))


def records(rows, first: int = 2) -> list:
    """Canonical records of (source, target) pairs, numbered from line `first` (a CSV's, below its header)."""
    return [{"source": s, "target": t, "line": i + first} for i, (s, t) in enumerate(rows)]


def test_files_read_source_and_target_with_a_column_mapping(tmp_path):
    rows = pairs(3, 0)
    path = csv(tmp_path / "a.csv", rows, "article,summary")
    got = read_task_file(path, "seq2seq", "source=article,target=summary")
    assert got == records(rows)
    assert read_task_file(jsonl(tmp_path / "a.jsonl", rows), "seq2seq") == records(rows, first=1)
    (tmp_path / "u.jsonl").write_text('{"source": "red blue"}\n')
    assert read_task_file(tmp_path / "u.jsonl", "seq2seq", labelled=False) == [
        {"source": "red blue", "target": None, "line": 1}]
    # the mapping beside each door's name for it ("columns (--columns) target=NAME" parted them)
    with pytest.raises(ValueError, match=r"u.jsonl:1: no column 'target' \(for target\).*map one with "
                                         r"columns='target=NAME' \(--columns target=NAME\)$"):
        read_task_file(tmp_path / "u.jsonl", "seq2seq")


def test_source_target_examples_train_seq2seq_lm_under_labels():
    # data.examples.source_target emits "target_ids"; Seq2SeqLM reads the target under "labels"
    model = transformer()
    ids = [[5, 6, 7, 2], [8, 9, 2]], [[10, 11, 2], [12, 2]]
    examples = source_target(list(zip(*ids)), max_source=8, max_target=8)
    assert "target_ids" in examples[0]
    objective = Seq2SeqLM(model, pad_id=1, decoder_start_id=2)
    batch = objective.collate(examples)
    assert batch["labels"].tolist() == [[10, 11, 2], [12, 2, IGNORE]]  # padded with IGNORE, not trained on
    assert batch["decoder_input_ids"].tolist() == [[2, 10, 11], [2, 12, 2]]  # start, then the target
    relabelled = objective.collate([{"input_ids": s, "labels": t} for s, t in zip(*ids)])
    assert torch.equal(objective.eval()(batch).loss, objective(relabelled).loss)
    task = Seq2SeqTask(transformer(), tokenizer())
    (example,) = task.encode({"source": "red blue", "target": "blue red"})
    assert "labels" in example and "target_ids" not in example


def test_targets_prefix_and_special_ids():
    tok, model = tokenizer(), transformer()
    assert model.config.decoder_start_token_id is None
    task = Seq2SeqTask(model, tok, prefix="summarize:", max_len=16)
    (ex,) = task.encode({"source": "red blue", "target": "blue red"})
    assert ex["input_ids"] == tok.encode("summarize: red blue").ids
    assert ex["labels"] == tok.encode("blue red").ids and ex["labels"][-1] == tok.eos_id
    # a model without a start id starts its decoder with </s>, as fairseq's Transformer; written to its config
    cfg = model.config
    ids = (cfg.decoder_start_token_id, cfg.eos_token_id, cfg.pad_token_id)
    assert ids == (tok.eos_id, tok.eos_id, tok.pad_id)
    batch = task.collate(task.encode_all(records([("red", "blue green"), ("red", "pink")])))
    assert batch["decoder_input_ids"][:, 0].tolist() == [tok.eos_id] * 2
    long = task.target(" ".join(["red"] * 40))
    assert len(long) == 16 and long[-1] == tok.eos_id  # cut to max_len, the end kept
    t5 = lmforge.build(lmforge.tiny("t5-small", vocab_size=200, pad_token_id=0, eos_token_id=1,
                                    decoder_start_token_id=0))
    t5_task = Seq2SeqTask(t5, tokenizer("t5"))
    assert (t5_task.start, t5_task.end) == (0, 1)  # a checkpoint's own start id (T5: <pad>) is kept
    assert make_task("seq2seq", transformer(), tok, [], TaskConfig(num_beams=3)).info() == {
        "kind": "seq2seq", "labels": None, "max_len": 64, "prefix": None, "num_beams": 3,
        "max_new_tokens": 64}


def test_a_target_cut_to_max_len_is_counted_and_said():
    task = Seq2SeqTask(transformer(), tokenizer(), max_len=8)
    fits = " ".join(["red"] * 6)  # <s> + 6 words + </s>: exactly max_len, not cut
    examples = task.encode_all(records([("red", fits), ("red", " ".join(["red"] * 30)), ("red", "blue")]))
    assert [len(e["labels"]) for e in examples] == [8, 8, 3] and task.target_cut == 1 and task.cut == 0
    said = []
    task.say_cut(3, "training", said.append)
    assert said == ["1 of 3 training records have a target longer than max_len=8 tokens, cut to its first 7 "
                    "and the end token for the loss (scores compare the whole target); raise max_len to "
                    "train on more"]
    task.encode_all(records([("red", "blue")]))
    assert task.target_cut == 0  # counted per encode_all, as the sources' cut


def test_a_budget_past_the_context_is_capped_and_said_once():
    tok, rows = tokenizer(), records(pairs(4, 3))
    task = Seq2SeqTask(transformer(seed=1, max_seq_len=16), tok)  # the default 64 exceeds the context
    assert task.max_new_tokens == 16 and task.info()["max_new_tokens"] == 16  # task.json: the budget used
    said = []
    for what in ("training", "validation"):
        task.encode_all(rows)
        task.say_cut(4, what, said.append)
    assert said == ["max_new_tokens=64 is more than the decoder's context, max_seq_len=16: predictions are "
                    "cut at 16 tokens"]
    predictions, _ = task.evaluate(rows, batch_size=2)  # generates, not refused
    ids = torch.tensor([tok.encode(rows[0]["source"]).ids])
    out = lmforge.generate(task.model, ids, max_new_tokens=16)[0, 1:].tolist()
    assert predictions[0] == tok.decode(out[:out.index(tok.eos_id)] if tok.eos_id in out else out).strip()
    fits, quiet = Seq2SeqTask(transformer(max_seq_len=16), tok, max_new_tokens=16), []
    fits.say_cut(4, "validation", quiet.append)
    assert quiet == []


def test_evaluation_stops_where_lmforge_generate_stops(tmp_path):
    tok, rows = tokenizer(), records(pairs(5, 3))
    other = (tok.eos_id + 3) % tok.vocab_size
    with pytest.raises(ValueError, match=rf"stops generating at eos_token_id={other} \(its config\) but the "
                                         rf"tokenizer ends text with id {tok.eos_id}"):
        Seq2SeqTask(transformer(eos_token_id=other), tok)  # targets would end where generation never stops
    model = Seq2SeqTask(transformer(seed=1), tok).model  # its LM head on, its config's ids filled
    prompt = torch.tensor([tok.encode(rows[0]["source"]).ids])
    first = int(lmforge.generate(model, prompt, max_new_tokens=1)[0, 1])
    assert first != tok.eos_id
    model.save(tmp_path)  # recommends a second stop id: the first token row 0 generates
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.eos_id, first]}))
    task = Seq2SeqTask(lmforge.load(tmp_path), tok, max_new_tokens=6)
    assert task.stops == [tok.eos_id, first]
    predictions, _ = task.evaluate(rows, batch_size=2)
    assert predictions[0] == ""
    loaded = lmforge.load(tmp_path)
    for record, prediction in zip(rows, predictions):  # the tokens lmforge.generate gives the loaded model
        ids = torch.tensor([tok.encode(record["source"]).ids])
        out = lmforge.generate(loaded, ids, max_new_tokens=6)[0, 1:].tolist()
        cut = next((i for i, t in enumerate(out) if t in (tok.eos_id, first)), len(out))
        assert prediction == tok.decode(out[:cut]).strip()


@pytest.mark.parametrize("build, message", [
    (lambda: lmforge.build(lmforge.tiny("gpt2")), "needs an encoder-decoder"),
    (lambda: transformer(), "num_beams must be an integer >= 1"),
])
def test_wrong_model_or_options_are_refused(build, message):
    with pytest.raises(ValueError, match=message):
        Seq2SeqTask(build(), tokenizer(), num_beams=0)


@pytest.mark.parametrize("beams", [1, 3])
def test_predictions_are_lmforge_generate_decoded(beams):
    tok = tokenizer()
    task = Seq2SeqTask(transformer(seed=1), tok, num_beams=beams, max_new_tokens=6)
    rows = records(pairs(5, 3))
    predictions, _ = task.evaluate(rows, batch_size=2)  # padded in batches of two
    for record, prediction in zip(rows, predictions):
        ids = torch.tensor([tok.encode(record["source"]).ids])
        out = lmforge.generate(task.model, ids, max_new_tokens=6, num_beams=beams)[0, 1:].tolist()
        out = out[:out.index(tok.eos_id)] if tok.eos_id in out else out
        assert prediction == tok.decode(out).strip()


def test_a_checkpoints_recommended_sampling_is_not_applied_in_evaluation(tmp_path):
    tok, rows = tokenizer(), records(pairs(6, 3))
    plain, _ = Seq2SeqTask(transformer(seed=1), tok, max_new_tokens=6).evaluate(rows, batch_size=2)
    transformer(seed=1).save(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "top_k": 50, "no_repeat_ngram_size": 1, "min_length": 5}))
    task = Seq2SeqTask(lmforge.load(tmp_path), tok, max_new_tokens=6)
    assert task.model.generation_config is not None  # the recommendation is there, and left out
    for seed in (0, 1):
        torch.manual_seed(seed)
        assert task.evaluate(rows, batch_size=2)[0] == plain  # greedy, as task.json says: no sampling


def test_scores_are_sacrebleu_and_rouge_score():
    gold = ["red blue green black", "white pink gold grey cyan", "lime navy teal red"]
    predicted = ["red blue green black", "white pink grey cyan", "navy lime red"]
    task = Seq2SeqTask(transformer(), tokenizer())
    metrics = task.score(records(zip(gold, gold)), predicted)
    assert list(metrics) == ["bleu", "rouge1", "rouge2", "rougeL", "gen_len"]
    assert metrics["bleu"] == pytest.approx(sacrebleu.corpus_bleu(predicted, [gold]).score)
    assert 0 < metrics["bleu"] < 100
    assert_rouge(metrics, gold, predicted)
    assert metrics["gen_len"] == pytest.approx(11 / 3)


def assert_rouge(metrics: dict, gold: list, predicted: list) -> None:
    """metrics' ROUGE-1/2/L are rouge-score's mean F-measures (x100) over the texts."""
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    scores = [scorer.score(g, p) for g, p in zip(gold, predicted)]
    for kind in ("rouge1", "rouge2", "rougeL"):
        assert metrics[kind] == pytest.approx(100 * sum(s[kind].fmeasure for s in scores) / len(scores))


def losses(run) -> list:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def evaluate_cli(capsys, model, data, preds) -> dict:
    """`lmforge evaluate` of a model on a file: its printed metrics, checked against sacrebleu and
    rouge-score computed from the predictions file."""
    capsys.readouterr()
    assert main(["evaluate", "--model", str(model), "--data", data, "--out", str(preds)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(printed[printed.index("{"):printed.rindex("}") + 1])
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    gold, predicted = [r["gold"] for r in rows], [r["prediction"] for r in rows]
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(predicted, [gold]).score)
    assert_rouge(result, gold, predicted)
    return result


def test_tiny_t5_checkpoint_learns_through_the_cli(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    tok = tokenizer("t5")
    torch.manual_seed(0)
    reference = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=tok.vocab_size, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1))
    reference.save_pretrained(tmp_path / "t5")  # a checkpoint as users receive it, and its tokenizer
    tok.save(tmp_path / "t5")
    train = jsonl(tmp_path / "train.jsonl", pairs(64, 0), "article", "summary")
    valid = jsonl(tmp_path / "valid.jsonl", pairs(8, 1), "article", "summary")
    out = tmp_path / "run"
    assert main(["finetune", "--model", str(tmp_path / "t5"), "--task", "seq2seq", "--train", train,
                 "--valid", valid, "--columns", "source=article,target=summary", "--out", str(out),
                 "--steps", "30", "prefix=copy", *FAST, "eval_every=30"]) == 0
    loss = losses(out)
    assert loss[-1] < 0.7 * loss[0], loss
    summary = json.loads((out / "summary.json").read_text())
    assert summary["primary"] == "bleu"
    assert set(summary["best"]) == {"bleu", "rouge1", "rouge2", "rougeL", "gen_len"}
    info = json.loads((out / "final" / "task.json").read_text())
    assert (info["kind"], info["prefix"], info["max_new_tokens"]) == ("seq2seq", "copy", 12)
    assert list(lmforge.load(out / "final").heads) == ["lm"]
    # the columns are mapped again at evaluation, where the prefix comes from task.json
    data = jsonl(tmp_path / "test.jsonl", pairs(6, 2))
    result = evaluate_cli(capsys, out / "final", data, tmp_path / "pred.jsonl")
    assert result["task"] == "seq2seq" and result["records"] == 6


@pytest.mark.slow  # an end-to-end run through the command line
def test_transformer_preset_trains_from_scratch_through_the_cli(tmp_path, capsys):
    tokenizer().save(tmp_path / "tok")
    train = csv(tmp_path / "train.csv", pairs(64, 0, reverse=True))
    out = tmp_path / "run"
    assert main(["finetune", "--model", "transformer-base", "--tokenizer", str(tmp_path / "tok"), "--task",
                 "seq2seq", "--train", train, "--out", str(out), "--steps", "30", "n_layers=2", "d_model=32",
                 "n_heads=4", "d_ff=64", "max_seq_len=32", "num_beams=2", *FAST]) == 0
    loss = losses(out)
    assert loss[-1] < 0.7 * loss[0], loss
    model = lmforge.load(out / "final")
    cfg, tok = model.config, tokenizer()
    assert (cfg.position, cfg.norm_placement, cfg.scale_embeddings) == ("sinusoidal", "post", True)
    assert cfg.d_model == 32
    assert (cfg.decoder_start_token_id, cfg.eos_token_id) == (tok.eos_id, tok.eos_id)
    assert json.loads((out / "final" / "task.json").read_text())["num_beams"] == 2
    valid = csv(tmp_path / "valid.csv", pairs(6, 1, reverse=True))
    result = evaluate_cli(capsys, out / "final", valid, tmp_path / "pred.jsonl")
    assert set(result) >= {"bleu", "rouge1", "rouge2", "rougeL"}
    # a file without targets: predictions only
    (tmp_path / "new.jsonl").write_text('{"source": "red blue green black"}\n')
    assert main(["evaluate", "--model", str(out / "final"), "--data", str(tmp_path / "new.jsonl"), "--out",
                 str(tmp_path / "new-pred.jsonl")]) == 0
    (row,) = [json.loads(line) for line in (tmp_path / "new-pred.jsonl").read_text().splitlines()]
    assert set(row) == {"line", "prediction"} and isinstance(row["prediction"], str)


@pytest.mark.parametrize("text, message", [
    ("source,summary\nred blue,blue red\n", "train.csv:2: no column 'target' (for target); the record has "
                                            "'source', 'summary'; map one with columns='target=NAME' "
                                            "(--columns target=NAME)"),
    ("source,target\nred blue, \n", "train.csv:2: empty target (column 'target')"),
])
def test_bad_files_exit_2_with_one_line(tmp_path, capsys, text, message):
    tokenizer().save(tmp_path / "tok")
    (tmp_path / "train.csv").write_text(text)
    assert main(["finetune", "--model", "transformer-base", "--tokenizer", str(tmp_path / "tok"), "--task",
                 "seq2seq", "--train", str(tmp_path / "train.csv"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_an_encoder_is_refused_with_exit_2(tmp_path, capsys):
    tokenizer().save(tmp_path / "tok")
    train = csv(tmp_path / "train.csv", pairs(4, 0))
    assert main(["finetune", "--model", "bert-base", "--tokenizer", str(tmp_path / "tok"), "--task",
                 "seq2seq", "--train", train, "--out", str(tmp_path / "o"), "n_layers=1", "d_model=32",
                 "n_heads=4", "d_ff=64"]) == 2
    assert "task 'seq2seq' needs an encoder-decoder" in capsys.readouterr().err
