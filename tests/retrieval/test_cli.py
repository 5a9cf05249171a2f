"""lmforge index build / retrieve / retrieve train on a tiny BERT: exit status 0 with results, 2 with a
one-line message naming the problem (corrupt index, bad QA line, unknown option)."""
from __future__ import annotations

import json

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.retrieval.passages import load_passages
from lmforge.tokenizer.train import train_tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    texts = [f"{p.title}. {p.text}" for p in load_passages(None)]
    tokenizer = train_tokenizer(texts, "wordpiece", 300)
    torch.manual_seed(0)
    model = lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64,
                          vocab_size=tokenizer.vocab_size, max_seq_len=64)
    model.save(path)
    tokenizer.save(path)
    return path


def test_index_build_and_query_dense_and_bm25(tiny, tmp_path, capsys):
    out = tmp_path / "ix"
    assert main(["index", "build", "--out", str(out), "--model", str(tiny), "--quiet", "max_length=64"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["dim"] == 32
    for method in ("dense", "bm25"):
        assert main(["retrieve", "--index", str(out), "--query", "Where was Migom Koudand born?",
                     "--query", "Which river?", "--k", "3", "--method", method]) == 0
        lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        assert [len(x["results"]) for x in lines] == [3, 3]
    assert lines[0]["results"][0]["title"] == "Migom Koudand"  # BM25 finds the named person
    (out / "dense" / "embeddings.npy").write_bytes(b"\x93NUMPY")
    assert main(["retrieve", "--index", str(out), "--query", "x"]) == 2
    err = capsys.readouterr().err
    assert "embeddings.npy: checksum does not match" in err and err.count("\n") == 1


@pytest.mark.slow  # ~20 s on a shared 2-core machine: two encoders, BM25, a short run of the trainer
def test_retrieve_train_writes_a_model_and_the_recall_table(tiny, tmp_path, capsys):
    out = tmp_path / "dpr"
    code = main(["retrieve", "train", "--model", str(tiny), "--out", str(out), "--steps", "4", "batch_size=8",
                 "progress=false", "max_length=64"])
    assert code == 0
    table = json.loads((out / "recall.json").read_text())
    assert set(table) == {"bm25", "untrained", "trained"} and 0 <= table["trained"]["recall@20"] <= 1
    assert (out / "final" / "retriever.json").is_file() and (out / "metrics.jsonl").is_file()
    assert "trained" in capsys.readouterr().out


def test_bad_input_is_one_line_with_status_2(tiny, tmp_path, capsys):
    bad = tmp_path / "qa.jsonl"
    bad.write_text('{"question": "Who?", "answers": ["A"], "context": "A did."}\nnot json\n')
    assert main(["retrieve", "train", "--model", str(tiny), "--out", str(tmp_path / "r"),
                 "--questions", str(bad)]) == 2
    assert "qa.jsonl: line 2: not JSON" in capsys.readouterr().err
    assert main(["retrieve", "train", "--model", str(tiny), "--out", str(tmp_path / "r"), "colour=red"]) == 2
    assert "unknown option colour" in capsys.readouterr().err
    assert main(["retrieve", "--index", str(tmp_path / "none"), "--query", "q", "--method", "bm25"]) == 2


def test_a_reader_longer_than_the_models_positions_is_refused_naming_max_len(tiny, tmp_path, capsys):
    assert main(["retrieve", "reader", "--model", str(tiny), "--out", str(tmp_path / "r"), "--max-len", "65",
                 "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "max_len=65" in err and "max_seq_len=64" in err and err.count("\n") == 1, err
    assert main(["retrieve", "reader", "--model", str(tiny), "--out", str(tmp_path / "r"),
                 "--negatives", "0"]) == 2
    assert "--negatives 0: must be" in capsys.readouterr().err


def test_retrieve_realm_writes_encoder_retriever_and_scores(tiny, tmp_path, capsys):
    out = tmp_path / "realm"
    code = main(["retrieve", "realm", "--model", str(tiny), "--out", str(out), "--steps", "2", "--k", "2",
                 "--refresh-every", "1", "--max-len", "64", "batch_size=4", "progress=false"])
    assert code == 0
    assert "has no MLM head: REALM starts one untrained" in capsys.readouterr().err  # a plain encoder: noted
    result = json.loads((out / "realm.json").read_text())
    assert result["test_examples"] > 0 and result["seed"] == 0  # the seed that drew the split, said
    assert set(result["after"]) == {"span_accuracy", "token_accuracy", "log_likelihood", "answer_recall",
                                    "p_null"}
    assert (out / "final" / "config.json").is_file() and \
        (out / "retriever" / "passage" / "config.json").is_file()
    assert lmforge.load(out / "final").heads["lm"] is not None
    capsys.readouterr()
    assert main(["retrieve", "realm", "--model", str(tiny), "--out", str(tmp_path / "x"), "--k", "0",
                 "--no-null-document"]) == 2
    assert "--no-null-document" in capsys.readouterr().err
    one_title = tmp_path / "one.jsonl"  # nothing to hold out: the split needs two documents
    one_title.write_text("".join(json.dumps({"id": str(i), "title": "t",
                                             "text": "Mupi is in Klirefaim. It rains."})
                                 + "\n" for i in range(3)))
    assert main(["retrieve", "realm", "--model", str(tiny), "--out", str(tmp_path / "y"), "--passages",
                 str(one_title), "--max-len", "64"]) == 2
    assert "--passages" in capsys.readouterr().err


def test_retrieve_ict_warm_starts_a_retriever_realm_can_read(tiny, tmp_path, capsys):
    out = tmp_path / "ict"
    assert main(["retrieve", "ict", "--model", str(tiny), "--out", str(out), "--steps", "2", "batch_size=8",
                 "progress=false"]) == 0
    result = json.loads((out / "ict.json").read_text())
    assert result["seed"] == 0
    assert result["train_pairs"] > result["test_pairs"] > 0 and 0 <= result["test_accuracy_after"] <= 1
    assert (out / "final" / "passage" / "config.json").is_file()  # Embed_doc of its own
    assert main(["retrieve", "realm", "--model", str(tiny), "--retriever", str(out / "final"), "--out",
                 str(tmp_path / "realm"), "--steps", "1", "--k", "2", "--max-len", "64", "batch_size=4",
                 "progress=false"]) == 0
    capsys.readouterr()
    assert main(["retrieve", "ict", "--model", str(tiny), "--out", str(tmp_path / "x"), "--keep", "2"]) == 2
    assert "--keep" in capsys.readouterr().err


def _other(tiny, tmp_path, name, d_model, seed):
    """A model of `d_model` and seed `seed` beside the tiny one's tokenizer."""
    from lmforge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny)
    torch.manual_seed(seed)
    model = lmforge.build("bert-base", n_layers=1, d_model=d_model, n_heads=2, d_ff=64,
                          vocab_size=tokenizer.vocab_size, max_seq_len=64)
    model.save(tmp_path / name)
    tokenizer.save(tmp_path / name)
    return tmp_path / name


def test_a_query_encoder_other_than_the_indexs_is_refused_naming_both(tiny, tmp_path, capsys):
    out = tmp_path / "ix"
    assert main(["index", "build", "--out", str(out), "--model", str(tiny), "--quiet"]) == 0
    capsys.readouterr()
    for other, says in ((_other(tiny, tmp_path, "wide", 48, 0), ("32-wide", "48-wide")),
                        (_other(tiny, tmp_path, "same-width", 32, 1), ("is another model", "encoder "))):
        assert main(["retrieve", "--index", str(out), "--query", "Which river?", "--model", str(other)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(tiny) in err and str(other) in err, err
        assert all(s in err for s in says), err
    from lmforge.retrieval.index import DenseIndex

    with pytest.raises(ValueError, match="32-wide"):  # no reshape of 64-wide rows into two queries
        DenseIndex.load(out / "dense").search(torch.zeros(1, 64), 3)


def test_the_indexs_weights_read_through_another_tokenizer_are_refused_naming_it(tiny, tmp_path, capsys):
    import shutil

    out, other = tmp_path / "ix", tmp_path / "retokenized"
    assert main(["index", "build", "--out", str(out), "--model", str(tiny), "--quiet"]) == 0
    shutil.copytree(tiny, other)  # the same weights (the encoder fingerprint matches), another vocabulary
    texts = [f"{p.title}. {p.text}"[::-1] for p in load_passages(None)]
    train_tokenizer(texts, "wordpiece", 300).save(other)
    capsys.readouterr()
    assert main(["retrieve", "--index", str(out), "--query", "Which river?", "--model", str(other)]) == 2
    err = capsys.readouterr().err
    assert "another tokenizer" in err and str(other) in err and err.count("\n") == 1, err
    assert main(["retrieve", "--index", str(out), "--query", "Which river?", "--model", str(tiny)]) == 0


def test_a_plain_encoder_is_refused_as_a_reader(tiny, tmp_path, capsys):
    out = tmp_path / "ix"
    assert main(["index", "build", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["retrieve", "--index", str(out), "--query", "Which river?", "--method", "bm25",
                 "--reader", str(tiny)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a trained reader" in err and "span-qa" in err, err


def test_an_index_longer_than_the_models_positions_is_refused_before_it_is_made(tiny, tmp_path, capsys):
    out = tmp_path / "ix"
    assert main(["index", "build", "--out", str(out), "--model", str(tiny), "max_length=65536"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_length=65536" in err and "max_seq_len=64" in err, err
    assert not out.exists()


@pytest.mark.parametrize("args, named", [
    (["retrieve", "--index", "{tmp}/none", "--query", "q"], "--index {tmp}/none: no such index"),
    (["retrieve", "train", "--questions", "{tmp}/none.jsonl"], "--questions {tmp}/none.jsonl: no such file"),
    (["retrieve", "train", "--questions", "{tmp}"], "--questions {tmp}: a folder"),
    (["retrieve", "ict", "--passages", "{tmp}/none.txt"], "--passages {tmp}/none.txt: no such file"),
    (["index", "build", "--passages", "{tmp}/none.txt"], "--passages {tmp}/none.txt: no such file"),
    # refused before training, not after it
    (["retrieve", "reader", "--retriever", "{tmp}/none"], "--retriever {tmp}/none: "),
    (["retrieve", "realm", "--retriever", "{tmp}/none"], "--retriever {tmp}/none: "),
])
def test_a_missing_input_is_one_line_naming_its_flag(tiny, tmp_path, capsys, args, named):
    out = ["--out", str(tmp_path / "out")] if args[1] != "--index" else []
    model = ["--model", str(tiny)] if args[0] == "retrieve" and out else []
    argv = [a.format(tmp=tmp_path) for a in args] + out + model
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named.format(tmp=tmp_path) in err and "Errno" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_query_refused_by_query_index_names_the_flag_not_the_field(tmp_path, capsys):
    out = tmp_path / "ix"
    assert main(["index", "build", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    cases = ((["--query", " "], "--query: queries[0] is blank"),
             (["--query", "x", "--k", "1001", "--reader", "r"], "--k 1001: a reader reads at most"),
             (["--query", "x", "--method", "bm25", "--model", "m"], "--model m: the dense search's"))
    for flags, says in cases:
        assert main(["retrieve", "--index", str(out), *flags]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err


def test_retrieve_train_flags_win_over_key_value_and_the_config_file(tiny, tmp_path, monkeypatch):
    import lmforge.retrieval.jobs as jobs

    class Captured(Exception):
        """The stand-in training run's options."""

    def run(model, out, cfg, *args, **kwargs):
        raise Captured(cfg)

    monkeypatch.setattr(jobs, "run_train", run)
    (tmp_path / "c.yaml").write_text("steps: 2\nseed: 7\nwarmup: 5\n")
    base = ["retrieve", "train", "--model", str(tiny), "--config", str(tmp_path / "c.yaml"), "--out"]
    with pytest.raises(Captured) as got:
        main([*base, str(tmp_path / "a"), "--steps", "1", "--seed", "3", "warmup=1"])
    assert (got.value.args[0].steps, got.value.args[0].seed, got.value.args[0].warmup) == (1, 3, 1)
    with pytest.raises(Captured) as got:  # no flag given: the file's, not the flag's default (seed 0)
        main([*base, str(tmp_path / "b")])
    assert (got.value.args[0].steps, got.value.args[0].seed, got.value.args[0].warmup) == (2, 7, 5)


@pytest.mark.parametrize("args, named", [
    (["retrieve", "--index", "/missing", "--query", "q", "--candidates", "-1"], "--candidates -1: "),
    (["retrieve", "--index", "/missing", "--query", "q", "--k", "1e7"], "--k 1e7: "),
    (["index", "build", "--passages", "/missing", "--out", "o", "--words", "0"], "--words 0: "),
    (["index", "build", "--passages", "/missing", "--out", "o", "max_length=1"], "max_length must be"),
    (["retrieve", "train", "--questions", "/missing", "--out", "o", "temperature=0"], "temperature must be"),
    (["retrieve", "ict", "--passages", "/missing", "--out", "o", "pooling=cls"], "takes no encoder options"),
])
def test_a_bad_option_is_named_before_any_missing_file(tmp_path, monkeypatch, capsys, args, named):
    """retrieve --index /missing --candidates -1 named the missing index: options are checked first."""
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and "/missing" not in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("resume", [False, True])
@pytest.mark.parametrize("command", ["train", "reader", "realm", "ict"])
def test_an_out_holding_a_run_s_checkpoints_exits_2_naming_out_before_any_read(tmp_path, capsys, command,
                                                                             resume):
    """Refused by the Python job (naming out, not --out), or by Trainer.fit once the model and the data
    were read; --resume gets past it, to the missing --model."""
    out, model = tmp_path / "run", tmp_path / "missing"
    (out / "checkpoints" / "step-0000002").mkdir(parents=True)
    assert main(["retrieve", command, "--model", str(model), "--out", str(out), "--steps", "1",
                 *(["--resume"] if resume else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (f"{model} is neither a model" in err if resume else err ==
                                     f"lmforge retrieve {command}: error: --out {out} already holds a run's "
                                     "checkpoints: pass resume=True (--resume) to continue it, or another "
                                     "folder\n")
