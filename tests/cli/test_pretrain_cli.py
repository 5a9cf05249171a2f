"""`lmforge pretrain`: what each source of an option gives, and which wins."""
import pytest

from lmforge.cli import main


class Captured(Exception):
    """Raised by a stand-in for the training run, carrying its options."""


def test_a_flag_wins_over_key_value_which_wins_over_the_config_file(tmp_path, monkeypatch):
    import lmforge.train.pretrain as pretrain

    def run(objective, out, train, recipe, inputs):
        raise Captured(train, recipe)

    monkeypatch.setattr(pretrain, "pretrain", run)
    (tmp_path / "c.yaml").write_text("steps: 2\nseed: 7\nlr: 1e-3\nwarmup: 5\nmax_len: 16\n")
    base = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(tmp_path / "o"),
            "--config", str(tmp_path / "c.yaml")]
    with pytest.raises(Captured) as got:
        main([*base, "--steps", "1", "--seed", "3", "--max-len", "8", "lr=2e-3"])
    train, recipe = got.value.args
    assert (train.steps, train.seed, recipe.max_len, train.lr, train.warmup) == (1, 3, 8, 2e-3, 5)
    with pytest.raises(Captured) as got:  # no flag: the file's, not the flag's default (seed 0)
        main(base)
    assert (got.value.args[0].steps, got.value.args[0].seed) == (2, 7)


@pytest.mark.usefixtures("few_probes")  # tests/conftest.py
def test_a_resume_from_a_damaged_or_non_object_trainer_json_is_refused_in_one_line(tmp_path, capsys):
    """A cut trainer.json, one holding a list or JSON nested too deeply (a RecursionError traceback): a
    resume exits 2 with one error line naming the file, never starting over on top of the run."""
    out = tmp_path / "run"
    args = ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(out), "--steps", "1",
            "batch_size=2", "save_every=1", "progress=false", "n_docs=50", "n_layers=1", "d_model=32",
            "n_heads=2", "d_ff=64", "max_seq_len=64"]
    assert main(args) == 0
    file = out / "checkpoints" / "step-0000001" / "trainer.json"
    text = file.read_text()
    args[8] = "2"
    for damaged in (text[: len(text) // 2], "[1, 2]", "[" * 100_000 + "]" * 100_000):
        file.write_text(damaged)
        capsys.readouterr()
        assert main([*args, "--resume"]) == 2
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("lmforge pretrain: error:")]
        assert len(errors) == 1 and "Traceback" not in err, err
        assert f"{file.parent}: trainer.json " in errors[0] and "refusing to start over" in errors[0]
    assert not (out / "checkpoints" / "step-0000002").exists()


def test_a_teacher_named_by_its_folder_is_read_only_once_the_request_is_checked(capsys, tmp_path,
                                                                                monkeypatch):
    """The command line loaded --teacher before pretrain() checked the data, so a bad --data was refused
    only after the teacher's weights were read; the teacher now goes by its folder, which pretrain() reads
    once every check has passed (a Python caller may give a folder too)."""
    import lmforge
    import lmforge.train.pretrain as recipe
    from lmforge.io import find_model_dir
    from lmforge.tokenizer import load_tokenizer
    from lmforge.train import TrainConfig

    teacher, data, read = tmp_path / "teacher", tmp_path / "c.jsonl", []
    lmforge.build("bert-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=64).save(teacher)
    load_tokenizer(find_model_dir("all-MiniLM-L6-v2")).save(teacher)
    (teacher / "model.safetensors").write_bytes(b"not weights")  # read first, it would be what is said
    data.write_text('{"body": "the cat sat"}\n')
    monkeypatch.setattr(recipe, "load", lambda path: read.append(path) or 1 / 0)
    assert main(["pretrain", "--objective", "distillation", "--teacher", str(teacher), "--data", str(data),
                 "--out", str(tmp_path / "o")]) == 2
    said = capsys.readouterr().err.strip()
    assert "no record has a string \"text\" field" in said and len(said.splitlines()) == 1
    assert read == [] and not (tmp_path / "o").exists()
    with pytest.raises(ZeroDivisionError):  # a good request: the folder read where the teacher is needed
        recipe.pretrain("distillation", tmp_path / "o", TrainConfig(steps=1), teacher=str(teacher), n_docs=20)
    assert read == [find_model_dir(teacher)]


def test_a_teacher_named_in_python_reads_with_its_own_tokenizer_as_the_command_line_does(tmp_path,
                                                                                        monkeypatch):
    """--teacher DIR reads DIR's tokenizer; pretrain(teacher="DIR") without tokenizer= trained one of its
    own on the corpus instead (329 ids) and was refused against the teacher's 30522: one request, two
    answers. The teacher's folder now gives its tokenizer unless one is given."""
    import lmforge
    import lmforge.train.pretrain as recipe
    from lmforge.io import find_model_dir
    from lmforge.tokenizer import load_tokenizer
    from lmforge.train import TrainConfig

    teacher, seen = tmp_path / "teacher", []
    lmforge.build("bert-tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64, max_seq_len=64).save(teacher)
    load_tokenizer(find_model_dir("all-MiniLM-L6-v2")).save(teacher)
    monkeypatch.setattr(recipe, "_objective", lambda spec, cfg, tok, *a: seen.append(tok) or 1 / 0)
    with pytest.raises(ZeroDivisionError):  # stopped once the objective would be built
        recipe.pretrain("distillation", tmp_path / "o", TrainConfig(steps=1), teacher=str(teacher), n_docs=20)
    assert seen[0].backend.get_vocab() == load_tokenizer(teacher).backend.get_vocab()
    assert not (tmp_path / "o" / "tokenizer").exists()  # none trained here, none written


def test_who_may_take_a_teacher_or_a_checkpoint_is_decided_before_either_is_read(tmp_path, monkeypatch):
    """'takes no teacher' and 'a checkpoint replaces a preset' were said after the teacher's or the
    checkpoint's weights were read; now before: nothing is loaded for a request refused on its face."""
    import lmforge.train.pretrain as recipe
    from lmforge.train import TrainConfig

    monkeypatch.setattr(recipe, "load", lambda path: pytest.fail(f"read {path}"))
    # each names the Python argument beside the flag (they named --teacher and --model alone)
    with pytest.raises(ValueError, match=r"objective 'mlm' takes no teacher model \(teacher=, --teacher DIR"):
        recipe.pretrain("mlm", tmp_path / "a", TrainConfig(steps=1), teacher="all-MiniLM-L6-v2", n_docs=20)
    with pytest.raises(ValueError, match=r"needs a teacher model \(teacher=, --teacher DIR\)"):
        recipe.pretrain("distillation", tmp_path / "b", TrainConfig(steps=1), preset="bert-tiny", n_docs=20)
    with pytest.raises(ValueError, match=r"\(model=, --model\) replaces a preset and a teacher"):
        recipe.pretrain("mlm", tmp_path / "c", TrainConfig(steps=1), model="all-MiniLM-L6-v2",
                        preset="bert-tiny", n_docs=20)
    assert not any((tmp_path / name).exists() for name in "abc")


@pytest.mark.parametrize("rank", [None, "0", "1"])
def test_the_wrote_line_is_printed_by_the_first_rank_alone(tmp_path, monkeypatch, capsys, rank):
    """Under torchrun every rank finishes the run: rank 0 (or a lone process) prints 'wrote', the others
    nothing (RANK, as rank_zero reads it)."""
    import lmforge.train.pretrain as pretrain

    monkeypatch.setattr(pretrain, "pretrain", lambda *args: None)
    if rank is not None:
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
    out = tmp_path / "o"
    # parallel=ddp: none is refused under several ranks (test_several_ranks)
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(out),
                 "parallel=ddp"]) == 0
    printed = capsys.readouterr().out
    assert printed == ("" if rank == "1" else f"wrote {out / 'final'}\n")


def test_a_teacher_named_as_an_installed_model_is_taken_with_its_tokenizer(tmp_path, capsys):
    """--teacher NAME read its tokenizer as a folder named NAME in the working directory ('does not
    exist'); pretrain() now resolves the teacher and its tokenizer as lmforge.load does, after the checks."""
    data = tmp_path / "c.jsonl"
    data.write_text('{"body": "the cat sat"}\n')
    assert main(["pretrain", "--objective", "distillation", "--teacher", "all-MiniLM-L6-v2",
                 "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    said = capsys.readouterr().err.strip()
    assert "no record has a string \"text\" field" in said and "does not exist" not in said


def test_python_refuses_a_teacher_beside_a_preset_or_config_fields_and_reads_a_tokenizer_folder(tmp_path,
                                                                                                monkeypatch):
    """--teacher with --preset or model fields is refused; pretrain(teacher=, preset=) trained the teacher's
    student and dropped the preset and overrides unsaid. A teacher or tokenizer of no usable type, or a
    tokenizer's folder name, failed as an AttributeError; now typed refusals, the folder read as one."""
    import lmforge.train.pretrain as recipe
    from lmforge.config.options import OptionsError
    from lmforge.io import find_model_dir
    from lmforge.tokenizer import load_tokenizer
    from lmforge.train import TrainConfig

    monkeypatch.setattr(recipe, "load", lambda path: pytest.fail(f"read {path}"))
    run = dict(train=TrainConfig(steps=1), n_docs=20)
    for extra in ({"preset": "bert-tiny"}, {"overrides": {"n_layers": 1}}):
        with pytest.raises(ValueError, match="from the teacher as it is: give no preset nor model config"):
            recipe.pretrain("distillation", tmp_path / "a", teacher="all-MiniLM-L6-v2", **run, **extra)
    with pytest.raises(OptionsError, match="teacher must be a model") as err:
        recipe.pretrain("distillation", tmp_path / "b", teacher=5, **run)
    assert err.value.field == "teacher"
    with pytest.raises(OptionsError, match="tokenizer: "):
        recipe.pretrain("mlm", tmp_path / "c", preset="bert-tiny", tokenizer=str(tmp_path / "none"), **run)
    load_tokenizer(find_model_dir("all-MiniLM-L6-v2")).save(tmp_path / "tok")
    seen = []
    monkeypatch.setattr(recipe, "_tokenizer", lambda spec, out, given, *rest: seen.append(given) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        recipe.pretrain("mlm", tmp_path / "d", preset="bert-tiny", tokenizer=str(tmp_path / "tok"), **run)
    assert seen[0].vocab_size == load_tokenizer(tmp_path / "tok").vocab_size
    assert not any((tmp_path / name).exists() for name in "abc")


@pytest.mark.parametrize("resume", [False, True])
def test_an_out_holding_a_run_s_checkpoints_exits_2_naming_out_before_any_read(tmp_path, capsys, resume):
    """It was refused by pretrain() (naming out, not --out) after the options and --tokenizer were read, or
    by Trainer.fit after the model and the corpus; --resume gets past it to the missing --model."""
    out = tmp_path / "run"
    (out / "checkpoints" / "step-0000002").mkdir(parents=True)
    assert main(["pretrain", "--model", str(tmp_path / "missing"), "--objective", "mlm", "--out", str(out),
                 "--steps", "1", *(["--resume"] if resume else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lmforge pretrain: error: ")
    assert ("missing is neither a model" in err if resume else err ==
            f"lmforge pretrain: error: --out {out} already holds a run's checkpoints: pass resume=True "
            "(--resume) to continue it, or another folder\n")


def test_what_to_start_from_is_said_by_the_python_argument_beside_the_flag(tmp_path):
    """No start, a model folder given as a preset and add_tokens without a checkpoint named only --model and
    --teacher, flags a Python caller of pretrain() never gave: model= and teacher= beside them."""
    import lmforge
    import lmforge.train.pretrain as recipe
    from lmforge.train import TrainConfig

    with pytest.raises(ValueError, match=r"\(model=, --model DIR\) or a teacher \(teacher=, --teacher DIR\)"):
        recipe.pretrain("mlm", tmp_path / "a", TrainConfig(steps=1), n_docs=20)
    lmforge.build(lmforge.tiny("bert-base")).save(tmp_path / "m")
    with pytest.raises(ValueError, match=r"continue pretraining it with model='.+' \(--model "):
        recipe.pretrain("mlm", tmp_path / "b", TrainConfig(steps=1), preset=str(tmp_path / "m"), n_docs=20)
    (tmp_path / "words.txt").write_text("zyzzyva\n")
    with pytest.raises(ValueError, match=r"give the checkpoint \(model=, --model DIR\)$"):
        recipe.pretrain("mlm", tmp_path / "c", TrainConfig(steps=1), preset="bert-tiny", n_docs=20,
                        add_tokens=str(tmp_path / "words.txt"))


def test_a_model_field_of_no_effect_on_the_preset_exits_2_before_the_corpus_is_read(tmp_path, capsys,
                                                                                     monkeypatch):
    """lstm_dim=64 on a BERT (ELMo's field) was taken and trained a BERT on which it did nothing."""
    import lmforge.train.pretrain as recipe

    monkeypatch.setattr(recipe, "documents", lambda *a, **k: pytest.fail("the corpus was read"))
    out = tmp_path / "run"
    assert main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(out), "--steps", "1",
                 "lstm_dim=64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lstm_dim=64 has no effect on this 'encoder' model: it is ELMo's" in err
    assert not (out / "tokenizer").exists()
