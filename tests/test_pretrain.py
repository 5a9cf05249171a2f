import json
from types import SimpleNamespace

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.tokenizer import load_tokenizer
from lmforge.train.pretrain import read_documents


@pytest.mark.slow  # an end-to-end run through the command line, stopped and resumed
def test_pretrain_mlm_on_the_builtin_corpus_and_resume(tmp_path, monkeypatch):
    out = tmp_path / "run"
    args = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(out), "--steps", "6",
            "batch_size=4", "log_every=2", "save_every=3", "progress=false", "n_layers=1", "d_model=32",
            "n_heads=2", "d_ff=64", "n_docs=100"]  # 100 documents: the probes are their own 800 sentences
    assert main(args) == 0
    model = lmforge.load(out / "final")
    tokenizer = load_tokenizer(out / "final")
    assert model.config.vocab_size == tokenizer.vocab_size and "lm" in model.heads
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4, 6] and (out / "loss.png").is_file()
    probed = json.loads((out / "probes.json").read_text())
    assert probed["trained"]["all"]["n"] == probed["untrained"]["all"]["n"] == 800
    assert {"copy", "tone", "context", "memory"} <= set(probed["trained"])
    assert {"accuracy", "mrr", "margin", "chance", "chance_mrr"} <= set(probed["trained"]["all"])
    ids = torch.tensor([tokenizer.encode("Tosk is a city.").ids])
    assert model(ids).logits.shape == (1, ids.shape[1], tokenizer.vocab_size)
    # a longer run resumes from the last checkpoint with the tokenizer the run already has (8 probes, not 800:
    # scoring them was most of the resumed run's time, and its probes.json is not read)
    monkeypatch.setattr("lmforge.train.pretrain.PROBES_PER_KIND", 1)
    assert main(args[:8] + ["12"] + args[9:] + ["--resume"]) == 0
    assert (out / "checkpoints" / "step-0000012").is_dir()
    assert load_tokenizer(out / "tokenizer").vocab_size == tokenizer.vocab_size


HEADS = {"nsp": {"lm", "nsp"}, "clm": {"lm"}, "wwm": {"lm"}, "span": {"lm"}, "structural": {"lm", "sso"},
         "rtd": {"rtd"}}


@pytest.mark.usefixtures("few_probes")  # tests/conftest.py
@pytest.mark.parametrize("objective,preset", [("nsp", "bert-tiny"), ("clm", "gpt2"), ("wwm", "bert-tiny"),
                                              ("span", "bert-tiny"), ("structural", "bert-tiny"),
                                              ("rtd", "electra-small")])
def test_pretrain_other_objectives(tmp_path, objective, preset):
    # 100 of the built-in corpus's documents: the heads a run ends with do not hang on how many it read
    args = ["pretrain", "--preset", preset, "--objective", objective, "--out", str(tmp_path), "--steps", "2",
            "batch_size=2", "progress=false", "n_layers=1", "d_model=32", "n_heads=2", "d_ff=64",
            "max_seq_len=64", "n_docs=100"]
    assert main(args) == 0
    assert set(lmforge.load(tmp_path / "final").heads) == HEADS[objective]


def test_bad_requests_exit_2(tmp_path, capsys):
    assert main(["pretrain", "--preset", "gpt2", "--objective", "mlm", "--out", str(tmp_path)]) == 2
    assert "does not fit" in capsys.readouterr().err
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(tmp_path / "typo"),
                 "warmpu=3"]) == 2  # neither a training option nor a model field
    assert "warmpu" in capsys.readouterr().err and not (tmp_path / "typo").exists()
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe text")
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(tmp_path / "x"),
                 "--data", str(tmp_path / "bad.txt")]) == 2
    assert "UTF-8" in capsys.readouterr().err


def test_an_out_nested_with_a_data_folder_is_refused_naming_both(tmp_path, capsys):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("One sentence. Another one.\n")
    for data, out in ((tmp_path / "corpus", tmp_path / "corpus" / "run"), (tmp_path / "corpus" / "a.txt",
                                                                         tmp_path / "corpus")):
        assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--data", str(data),
                     "--out", str(out), "--steps", "1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--data" in err and "--out" in err and "lies inside" in err, err
    assert [p.name for p in (tmp_path / "corpus").iterdir()] == ["a.txt"]


def test_read_documents_splits_blocks_and_sentences(tmp_path):
    (tmp_path / "a.txt").write_text("One. Two!\nThree?\n\n\nFour.\n")
    assert read_documents([tmp_path / "a.txt"]) == [["One.", "Two!", "Three?"], ["Four."]]


@pytest.mark.usefixtures("few_probes")
def test_distillation_and_static_masking_through_the_cli(tmp_path, capsys):
    teacher_dir = tmp_path / "teacher"
    common = ["--steps", "2", "batch_size=2", "progress=false", "n_docs=100"]  # 100 documents: enough here
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(teacher_dir),
                 "--duplication", "3", *common, "n_layers=2", "d_model=32", "n_heads=2", "d_ff=64",
                 "max_seq_len=64"]) == 0
    teacher = lmforge.load(teacher_dir / "final")
    student_dir = tmp_path / "student"
    # the student is the teacher's every other layer: a model config field is refused, not ignored
    assert main(["pretrain", "--objective", "distillation", "--teacher", str(teacher_dir / "final"),
                 "--out", str(student_dir), *common, "max_seq_len=32"]) == 2
    assert "max_seq_len" in capsys.readouterr().err and not student_dir.exists()
    assert main(["pretrain", "--objective", "distillation", "--teacher", str(teacher_dir / "final"),
                 "--out", str(student_dir), *common]) == 0
    student = lmforge.load(student_dir / "final")
    assert student.config.n_layers == 1 and student.config.d_model == teacher.config.d_model
    assert "lm" in student.heads
    logged = json.loads((student_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"ce_loss", "mlm_loss", "cos_loss"} <= set(logged)
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "distillation",
                 "--out", str(tmp_path / "x"), *common]) == 2
    assert "--teacher" in capsys.readouterr().err
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm",
                 "--teacher", str(teacher_dir / "final"), "--out", str(tmp_path / "y"), *common]) == 2
    assert "give one of --preset" in capsys.readouterr().err


def test_the_runs_tokenizer_replaces_a_link_named_tokenizer_and_leaves_its_target(tmp_path):
    """OUT/tokenizer is staged and put in place whole (other ranks see all of it or none): a link there
    is replaced, not written through, and the run goes on."""
    from lmforge.data.synthetic import documents
    from lmforge.train.tokenizer_run import run_tokenizer

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tokenizer").symlink_to(elsewhere, target_is_directory=True)
    tokenizer = run_tokenizer(tmp_path / "out", "bert", documents(40, seed=0), 300)
    path = tmp_path / "out" / "tokenizer"
    assert not path.is_symlink() and (path / "tokenizer.json").is_file() and not list(elsewhere.iterdir())
    assert load_tokenizer(path).vocab_size == tokenizer.vocab_size


@pytest.mark.parametrize("damage", ["vocab", "delete-config", "edit-record"])
def test_the_runs_tokenizer_is_read_back_verified(tmp_path, damage):
    """A resumed run read OUT/tokenizer as it found it: a changed vocabulary entry (still JSON) tokenized the
    rest of the run otherwise, unsaid (helper's probe); its files' checksums now stand beside them."""
    from lmforge.data.synthetic import documents
    from lmforge.tokenizer import TokenizerError
    from lmforge.train.tokenizer_run import run_tokenizer

    docs = list(documents(40, seed=0))  # read by every call: the tokenizer is checked against them
    trained = run_tokenizer(tmp_path, "bert", docs, 300)
    assert run_tokenizer(tmp_path, "bert", docs, 300).backend.get_vocab() == trained.backend.get_vocab()
    path = tmp_path / "tokenizer"
    if damage == "vocab":
        text = (path / "tokenizer.json").read_text()
        (path / "tokenizer.json").write_text(text.replace('"the":', '"thd":', 1))
        assert '"the":' in text
    elif damage == "delete-config":
        (path / "tokenizer_config.json").unlink()
    else:
        record = json.loads((path / "sha256.json").read_text())
        (path / "sha256.json").write_text(json.dumps({**record, "tokenizer.json": "0" * 64}))
    named = {"vocab": "tokenizer.json", "delete-config": "tokenizer_config.json",
             "edit-record": "sha256.json"}
    with pytest.raises(TokenizerError) as refused:
        run_tokenizer(tmp_path, "bert", docs, 300)
    said = str(refused.value)
    assert said.startswith(str(path / named[damage])) and "\n" not in said, said


def test_a_misspelt_option_with_a_preset_is_named_among_every_kind_of_option(tmp_path, capsys):
    """`duplicaton=2` with --preset was refused listing the model's fields only, as if duplication, steps
    and batch_size were no options; the refusal names it and where every option is listed, before any work."""
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(tmp_path / "o"),
                 "--steps", "1", "duplicaton=2"]) == 2
    err = capsys.readouterr().err
    assert "unknown option duplicaton" in err and "lmforge options pretrain" in err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


@pytest.mark.usefixtures("few_probes")
def test_distillation_loss_weights_are_objective_options(tmp_path):
    """objective_options={alpha: 0} drops DistilBERT's soft term: the first step's loss is
    beta L_mlm + gamma L_cos (2, 1) though L_ce is not 0; the defaults add alpha L_ce (5)."""
    from lmforge.train import TrainConfig
    from lmforge.train.pretrain import pretrain

    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(tmp_path / "t"),
                 "--steps", "1", "batch_size=2", "progress=false", "n_docs=50", "n_layers=2", "d_model=32",
                 "n_heads=2", "d_ff=64", "max_seq_len=64"]) == 0
    logged = {}
    for name, options in (("off", {"alpha": 0}), ("default", None)):
        teacher = lmforge.load(tmp_path / "t" / "final")
        torch.manual_seed(0)  # the same teacher for both runs
        teacher.reset_parameters(std=0.3)  # a confident teacher, so L_ce is far from 0
        train = TrainConfig(steps=1, batch_size=2, log_every=1, progress=False)
        pretrain("distillation", tmp_path / name, train, teacher=teacher, n_docs=50, log=lambda line: None,
                 tokenizer=load_tokenizer(tmp_path / "t" / "final"), objective_options=options)
        logged[name] = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])
    off, default = logged["off"], logged["default"]
    assert off["ce_loss"] > 0.1 and off["ce_loss"] == pytest.approx(default["ce_loss"], rel=1e-5)
    assert off["loss"] == pytest.approx(2 * off["mlm_loss"] + off["cos_loss"], rel=1e-4)
    weighted = 5 * default["ce_loss"] + 2 * default["mlm_loss"] + default["cos_loss"]
    assert default["loss"] == pytest.approx(weighted, rel=1e-4)


@pytest.mark.usefixtures("few_probes")
def test_a_resume_with_other_objective_options_is_refused_naming_them(tmp_path, capsys):
    """The run's objective options are recorded with its checkpoints: a resume at another masking rate
    would have continued the run on other examples, unsaid."""
    out = tmp_path / "run"
    args = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(out), "--steps", "2",
            "batch_size=2", "save_every=1", "progress=false", "n_docs=50", "n_layers=1", "d_model=32",
            "n_heads=2", "d_ff=64", "max_seq_len=64", "objective_options={rate: 0.2}"]
    assert main(args) == 0
    args[8] = "3"
    capsys.readouterr()
    assert main([*args[:-1], "objective_options={rate: 0.3}", "--resume"]) == 2
    assert "objective_options={'rate': 0.2} (the run's) vs {'rate': 0.3}" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0 and (out / "checkpoints" / "step-0000003").is_dir()


def test_a_run_says_what_it_read_and_refuses_a_text_too_short_to_train_on(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("The cat sat on the mat. It was warm.\n\n" * 2 + "A dog ran far away.\n")
    args = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--steps", "2", "batch_size=2",
            "progress=false", "n_layers=1", "d_model=32", "n_heads=2", "d_ff=64",
            "--data", str(tmp_path / "a.txt")]
    assert main(args + ["--out", str(tmp_path / "short"), "--max-len", "8"]) == 0
    said = capsys.readouterr().err  # a run's notes: on standard error
    assert "read 3 documents (1 repeats), 5 sentences, " in said
    assert " held-out examples of up to 8 tokens" in said
    assert main(args + ["--out", str(tmp_path / "long")]) == 2  # 128 tokens: one example, held out
    err = capsys.readouterr().err
    assert "makes 1 example(s) of up to 128 tokens, held out for validation, and none to train on" in err


def test_sentence_pairs_from_one_sentence_documents_are_refused_saying_what_the_text_lacks(tmp_path, capsys):
    """NSP's pairs are cut from documents of 2+ sentences: no max_len helps one-sentence documents."""
    (tmp_path / "a.txt").write_text("The cat sat on the mat.\n\nThe dog ran to the cat.\n\n" * 20)
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "nsp", "--steps", "1", "--max-len", "16",
                 "progress=false", "n_layers=1", "--data", str(tmp_path / "a.txt"),
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "give more text, in documents of 2+ sentences" in err and "max_len" not in err.split("give")[-1]


def test_sentence_pairs_too_few_from_long_documents_are_still_told_a_smaller_max_len(tmp_path, capsys):
    """A document of 12 sentences makes one NSP chunk at max_len 128 and several at 24: the pairs' '2+
    sentences' hint is for one-sentence documents only, not every pair objective's short text."""
    text = " ".join(f"The {w} sat on the mat by the big red house." for w in ("cat", "dog", "fox") * 4)
    (tmp_path / "a.txt").write_text(text + "\n")
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "nsp", "--steps", "1",
                 "--max-len", "128", "progress=false", "n_layers=1", "--data", str(tmp_path / "a.txt"),
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "12 sentences" in err and "give more text, or a smaller max_len" in err and "2+" not in err


def test_only_the_first_process_says_what_the_run_read(monkeypatch):
    """Under torchrun every rank reads the corpus: the first one says so, the others say nothing."""
    from lmforge.train.pretrain import rank_zero

    said = []
    monkeypatch.setenv("RANK", "1")
    rank_zero(said.append)("read 3 documents")
    monkeypatch.setenv("RANK", "0")
    rank_zero(said.append)("read 3 documents")
    monkeypatch.delenv("RANK")
    rank_zero(said.append)("no torchrun")
    assert said == ["read 3 documents", "no torchrun"]


@pytest.mark.usefixtures("few_probes")
def test_jsonl_data_is_read_by_its_text_field_and_a_resume_reading_it_otherwise_is_refused(tmp_path, capsys):
    """`pretrain --data` takes `corpus shard`'s read options: a JSONL export whose text sits under
    "content" had been unreadable to pretrain (no text), though `corpus shard --text-field content`
    read it."""
    import json

    lines = [{"content": f"Document {i} says the cat sat on mat {i}. Then the dog ran far away."}
             for i in range(12)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "run"
    args = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(out), "--steps", "2",
            "batch_size=2", "save_every=1", "progress=false", "n_layers=1", "d_model=32", "n_heads=2",
            "d_ff=64", "max_seq_len=64", "--max-len", "16", "--data", str(tmp_path / "a.jsonl")]
    assert main(args) == 2  # the default field, "text", is in no record
    err = capsys.readouterr().err  # one line naming the file, the fields its records have and the flag
    assert err.count("\n") == 1 and "a.jsonl" in err and "content" in err and "--text-field" in err, err
    assert main([*args, "--text-field", "content"]) == 0
    assert "read 12 documents" in capsys.readouterr().err
    args[8] = "3"
    assert main([*args, "--text-field", "content", "--max-sentence-chars", "20", "--resume"]) == 2
    assert "'max_sentence_chars': 100000} (the run's) vs" in capsys.readouterr().err
    assert main([*args, "--text-field", "content", "--resume"]) == 0
    assert (out / "checkpoints" / "step-0000003").is_dir()


def _tree(folder) -> dict:
    """Every path under `folder` with its bytes (None: a folder)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in folder.rglob("*")}


@pytest.mark.usefixtures("few_probes")  # the earlier run's probes.json is not read
def test_a_text_too_short_to_train_on_leaves_no_tokenizer_nor_touches_an_earlier_runs_files(tmp_path, capsys):
    """The refusal comes before the run's tokenizer is written: a fresh OUT is not made, and an OUT holding
    an earlier run (its tokenizer trained on other text, a file of the user's) is as it was, --resume too."""
    from lmforge.train import TrainConfig
    from lmforge.train.pretrain import pretrain

    (tmp_path / "short.txt").write_text("one short line.\n")
    tiny = ["n_layers=1", "d_model=32", "n_heads=2", "d_ff=64", "max_seq_len=64", "progress=false"]
    args = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--steps", "1", *tiny]
    assert main([*args, "--out", str(tmp_path / "fresh"), "--data", str(tmp_path / "short.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert "none to train on" in err and len(err.splitlines()) == 1 and not (tmp_path / "fresh").exists()
    out = tmp_path / "out"
    assert main([*args, "--out", str(out), "n_docs=40"]) == 0  # the earlier run, on the built-in corpus
    (out / "notes.txt").write_text("mine\n")
    before = _tree(out)
    fields = dict(preset="bert-tiny", data=[str(tmp_path / "short.txt")],
                  overrides={"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64})
    # without --resume, the earlier run's checkpoints are refused first (run_folder), before any read
    for resume, said in ((False, "already holds a run's checkpoints"), (True, "none to train on")):
        with pytest.raises(ValueError, match=said):
            pretrain("mlm", out, TrainConfig(steps=2, progress=False), resume=resume, **fields)
        assert _tree(out) == before
    with pytest.raises(ValueError, match="max_len must be an integer"):  # refused before the corpus is read
        pretrain("mlm", tmp_path / "fresh", TrainConfig(steps=1), max_len=65, **fields)
    assert not (tmp_path / "fresh").exists()


def test_the_tokenizer_is_written_past_the_trainers_refusals_or_at_once_under_torchrun(monkeypatch, tmp_path):
    """One process: the Trainer's own refusals (device, epochs) come before the tokenizer is written; under
    torchrun it is written as soon as it is trained: the other ranks wait for it to build their examples."""
    from lmforge.train import pretrain as recipe

    said = []

    def refused():
        said.append("trainer")
        raise ValueError("device")

    with pytest.raises(ValueError):
        recipe._trainer(lambda: said.append("keep"), refused)
    assert said == ["trainer"]
    monkeypatch.setattr(recipe, "pending_tokenizer", lambda *a: ("tok", lambda: said.append("keep")))
    spec = SimpleNamespace(tokenizer="wordpiece")  # what _tokenizer reads of an objective's spec
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert recipe._tokenizer(spec, tmp_path, None, None, None, [], 100)[0] == "tok"
    assert said == ["trainer"]  # one process: kept for later
    monkeypatch.setenv("WORLD_SIZE", "2")
    tokenizer, keep = recipe._tokenizer(spec, tmp_path, None, None, None, [], 100)
    assert said == ["trainer", "keep"] and keep is recipe.already_kept  # written now, nothing left to write


@pytest.mark.parametrize("resume", [False, True])
def test_an_out_holding_a_run_s_checkpoints_is_refused_naming_out_before_the_model_is_read(tmp_path, resume):
    """pretrain(out=a folder holding checkpoints) without resume was refused only by Trainer.fit, once the
    model and the corpus were read and a tokenizer trained: here a missing model was the error said."""
    from lmforge.train import TrainConfig
    from lmforge.train.pretrain import pretrain
    from lmforge.utils.atomic import UnsafePath

    out = tmp_path / "run"
    (out / "checkpoints" / "step-0000002").mkdir(parents=True)
    with pytest.raises(Exception) as err:
        pretrain("mlm", out, TrainConfig(steps=1), model=str(tmp_path / "missing"), resume=resume,
                 log=lambda *a: None)
    if resume:  # past the check: the model is read, and found missing
        assert not isinstance(err.value, UnsafePath) and "missing is neither a model" in str(err.value)
    else:
        assert isinstance(err.value, UnsafePath) and err.value.field == "out"
        assert str(err.value) == (f"out {out} already holds a run's checkpoints: pass resume=True (--resume) "
                                  "to continue it, or another folder")
