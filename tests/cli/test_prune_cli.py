"""`lmforge prune` and `lmforge heads --prune`: int8 models, unsafe --out folders and options a method
does not use are refused up front in one line; the sparsity achieved is reported beside the one asked,
and an amount that rounds to nothing is refused naming --sparsity."""
import json
import shutil

import pytest

from lmforge.cli import main
from lmforge.compress.quantize import quantize
from tests.tasks.core import fine_tuned_sentiment, tiny, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
METHODS = ["ffn", "heads", "magnitude", "movement", "soft-movement"]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(fine-tuned tiny BERT directory: 2 layers x 4 heads, d_ff 64; its dev file)."""
    root = tmp_path_factory.mktemp("prune_cli")
    path, data = fine_tuned_sentiment(root / "sst")
    dev = root / "dev.jsonl"
    dev.write_text("".join(json.dumps(r) + "\n" for r in data["validation"][:48]))
    return path, dev


@pytest.fixture(scope="module")
def int8_dir(tmp_path_factory):
    """A tiny BERT quantised to int8, saved with its tokenizer."""
    path = tmp_path_factory.mktemp("int8") / "model"
    quantize(tiny("bert-base", n_layers=2, n_heads=4), alpha=None).save(path)
    tokenizer().save(path)
    return path


def _prune(model, dev, out, method="ffn", sparsity="0.5", *extra):
    return main(["prune", "--model", str(model), "--task", "cls", "--method", method, "--sparsity", sparsity,
                 "--data", str(dev), "--out", str(out), *extra])


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("method", METHODS)
def test_an_int8_model_is_refused_before_any_work(int8_dir, tuned, tmp_path, capsys, method):
    extra = ["--train", str(tuned[1]), "--steps", "2"] if method not in ("ffn", "heads") else []
    assert _prune(int8_dir, tuned[1], tmp_path / "o", method, "0.5", *extra) == 2
    err = _one_line_error(capsys)
    assert "int8" in err and "prune the fp32 model" in err and "no Linear layers" not in err
    assert not (tmp_path / "o").exists()


def test_heads_prune_refuses_an_int8_model(int8_dir, tuned, tmp_path, capsys):
    assert main(["heads", "--model", str(int8_dir), "--task", "cls", "--data", str(tuned[1]),
                 "--prune", "0.3", "--out", str(tmp_path / "h")]) == 2
    assert "int8" in _one_line_error(capsys) and not (tmp_path / "h").exists()


def test_unsafe_out_folders_are_refused_up_front(tuned, tmp_path, capsys):
    path, dev = tuned
    source = tmp_path / "src"
    shutil.copytree(path, source / "model")
    before = (source / "model" / "model.safetensors").read_bytes()
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, words in (("", "is empty"), (afile, "not a folder"),
                       (source, f"holds the input --model {source / 'model'}: "),
                       (source / "model", f"is the input --model {source / 'model'}: ")):
        assert _prune(source / "model", dev, out) == 2
        assert "--out" in (err := _one_line_error(capsys)) and words in err
    assert (source / "model" / "model.safetensors").read_bytes() == before and afile.read_text() == "x"
    assert main(["heads", "--model", str(source / "model"), "--data", str(dev), "--prune", "0.3",
                 "--out", str(source)]) == 2
    assert f"--out {source} holds the input --model {source / 'model'}: " in _one_line_error(capsys)


@pytest.mark.parametrize("method, extra, option", [
    ("ffn", ["--valid", "v.jsonl"], "--valid"), ("heads", ["--resume"], "--resume"),
    ("ffn", ["--seed", "3"], "--seed"), ("heads", ["--config", "c.yaml"], "--config"),
    ("ffn", ["--train", "t.jsonl"], "--train"), ("ffn", ["lr=1e-3"], "key=value"),
    ("magnitude", ["--importance-data", "i.jsonl"], "--importance-data"),
])
def test_options_a_method_does_not_use_are_refused(tuned, tmp_path, capsys, method, extra, option):
    assert _prune(tuned[0], tuned[1], tmp_path / "o", method, "0.5", *extra) == 2
    err = _one_line_error(capsys)
    assert option in err and f"--method {method}" in err
    verb = "options are" if option == "key=value" else "is"
    assert f"{option} {verb} not used" in err


@pytest.mark.parametrize("command", ["prune", "quantize"])
def test_a_task_that_is_no_task_kind_names_task(tuned, tmp_path, capsys, command):
    path, dev = tuned
    method = ["--method", "ffn", "--sparsity", "0.5"] if command == "prune" else []
    out = tmp_path / "o"
    argv = [command, "--model", str(path), "--task", "bogus", "--data", str(dev), "--out", str(out), *method]
    assert main(argv) == 2
    err = _one_line_error(capsys)
    assert "--task 'bogus': expected one of cls, pair" in err and not (tmp_path / "o").exists()


def test_an_unreadable_importance_file_names_its_option(tuned, tmp_path, capsys):
    assert _prune(tuned[0], tuned[1], tmp_path / "o", "heads", "0.5", "--importance-data",
                  str(tmp_path / "nofile.jsonl")) == 2
    err = _one_line_error(capsys)
    assert "--importance-data" in err and "nofile.jsonl" in err and "No such file" in err


@pytest.mark.parametrize("method, sparsity, smallest", [
    ("ffn", "0.001", "0.0079"),  # 64 x (1 - 0.0079) = 63.49 rounds to 63 kept; 0.0078 keeps 64
    ("heads", "0.05", "0.125"),  # whole heads: one of 8
])
def test_a_sparsity_that_removes_nothing_is_refused(tuned, tmp_path, capsys, method, sparsity, smallest):
    assert _prune(tuned[0], tuned[1], tmp_path / "o", method, sparsity) == 2
    err = _one_line_error(capsys)
    assert f"--sparsity {sparsity} removes no" in err
    assert f"the smallest sparsity that removes one is {smallest}" in err
    assert not (tmp_path / "o" / "model").exists()


@pytest.mark.parametrize("method, sparsity, removed, of", [
    ("heads", "0.3", 2, 8), ("heads", "0.999", 6, 8),  # whole heads; each of the 2 layers keeps one
    ("ffn", "0.3", 2 * (64 - 45), 128),  # each layer keeps round(64 x 0.7) = 45 units
    ("ffn", "0.5", 64, 128),
])
def test_the_sparsity_achieved_is_reported_beside_the_one_asked(tuned, tmp_path, capsys, method, sparsity,
                                                                 removed, of):
    import lmforge
    from lmforge.compress.head_importance import full_gates, total_heads

    assert _prune(tuned[0], tuned[1], tmp_path / "o", method, sparsity) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "o" / "prune.json").read_text())
    unit = "heads" if method == "heads" else "FFN units"
    assert report["removed"] == {"unit": unit, "removed": removed, "of": of}
    assert report["achieved_sparsity"] == removed / of and f"{removed / of:.4f} removed" in out
    model = lmforge.load(tmp_path / "o" / "model")  # counted on the saved model
    cfg = model.config
    left = total_heads(full_gates(cfg)) if method == "heads" else sum(cfg.ffn_sizes.values())
    assert left == of - removed
    assert ("rounds to" in out) == (removed / of != float(sparsity)) == ("rounding" in report)
    assert report["speedup"] == report["before"]["seconds_b16"] / report["after"]["seconds_b16"]  # both timed
    names = (report["metric_name"], report["before"]["metric_name"], report["after"]["metric_name"])
    assert names == ("accuracy",) * 3


def test_a_resume_with_other_pruning_settings_is_refused_naming_the_option_and_both_values(tuned, tmp_path,
                                                                                            capsys):
    path, dev = tuned
    run = ["--train", str(dev), "--steps", "2", "progress=false", "batch_size=8"]
    assert _prune(path, dev, tmp_path / "o", "magnitude", "0.5", *run) == 0
    capsys.readouterr()
    for sparsity, extra, named in (("0.7", [], ("--sparsity 0.7", "(--sparsity 0.5)")),
                                   ("0.5", ["end=0.5"], ("end=0.5", "(end=0.7)")),
                                   ("0.5", ["--steps", "4"], ("--steps 4", "(--steps 2)")),
                                   ("0.5", ["max_len=16"], ("max_len=16", "(max_len=128)"))):
        assert _prune(path, dev, tmp_path / "o", "magnitude", sparsity, *run, *extra, "--resume") == 2
        err = _one_line_error(capsys)
        assert all(words in err for words in named) and "resumed" in err, err
    fewer = tmp_path / "train.jsonl"  # the same options, another --train file
    fewer.write_text("".join(dev.read_text().splitlines(keepends=True)[1:]))
    other = ["--train", str(fewer), *run[2:]]
    assert _prune(path, dev, tmp_path / "o", "magnitude", "0.5", *other, "--resume") == 2
    assert "trained on other data" in _one_line_error(capsys)
    report = json.loads((tmp_path / "o" / "prune.json").read_text())
    assert report["sparsity"] == 0.5  # the run's report stands
    assert _prune(path, dev, tmp_path / "o", "magnitude", "0.5", *run, "--resume") == 0  # the same: resumed


def test_a_resume_whose_settings_file_is_missing_edited_or_cut_is_refused_naming_it(tuned, tmp_path, capsys):
    """prune_settings.json is what a resume is checked against: without it, or where it does not match
    its checksum, the resume is refused naming the file, not run on the settings given."""
    path, dev = tuned
    run = ["--train", str(dev), "--steps", "2", "progress=false", "batch_size=8", "save_every=1"]
    assert _prune(path, dev, tmp_path / "o", "magnitude", "0.5", *run) == 0
    settings = tmp_path / "o" / "prune_settings.json"
    written = settings.read_text()
    for damage in (lambda: settings.unlink(),
                   lambda: settings.write_text(written.replace('": 0.5', '": 0.3')),
                   lambda: settings.write_text(written[:30])):
        damage()
        capsys.readouterr()
        assert _prune(path, dev, tmp_path / "o", "magnitude", "0.3", *run, "--resume") == 2
        assert "prune_settings.json" in _one_line_error(capsys)
        settings.write_text(written)
    report = json.loads((tmp_path / "o" / "prune.json").read_text())
    assert report["sparsity"] == 0.5  # the run's report stands


def test_an_existing_model_folder_is_replaced_whole_and_said(tuned, tmp_path, capsys):
    path, dev = tuned
    stale = tmp_path / "o" / "model"
    (stale / "1_Pooling").mkdir(parents=True)
    (stale / "keep.txt").write_text("old")
    (tmp_path / "o" / "notes.txt").write_text("beside")
    assert _prune(path, dev, tmp_path / "o", "ffn", "0.5") == 0
    assert f"{stale} existed: replaced as a whole" in capsys.readouterr().out
    assert not (stale / "keep.txt").exists() and not (stale / "1_Pooling").exists()
    assert (stale / "model.safetensors").is_file() and (tmp_path / "o" / "notes.txt").read_text() == "beside"


@pytest.mark.parametrize("method, sparsity, field", [
    ("magnitude", "1.5", "sparsity"),
    ("movement", "0", "sparsity"),
    ("soft-movement", "nan", "sparsity"),
])
def test_python_and_the_command_line_refuse_the_same_sparse_options_before_any_work(tuned, tmp_path, capsys,
                                                                                    method, sparsity, field):
    from lmforge.compress.sparse_finetune import SparseConfig
    from lmforge.config.options import OptionsError

    with pytest.raises(OptionsError) as refused:
        SparseConfig(method=method, sparsity=float(sparsity))
    assert refused.value.field == field
    assert _prune(tuned[0], tuned[1], tmp_path / "o", method, sparsity, "--train", str(tuned[1]), "--steps",
                  "2") == 2
    assert f"--sparsity {sparsity}: must be" in _one_line_error(capsys)  # as typed: 0, not 0.0
    assert not (tmp_path / "o").exists()  # not even prune_settings.json


def test_sparse_options_have_no_default_method_or_sparsity_and_key_value_sets_the_schedule_only(
        tuned, tmp_path, capsys):
    from lmforge.compress.sparse_finetune import SCHEDULE, SparseConfig
    from lmforge.config.options import OptionsError

    for given, field in (({}, "method"), ({"method": "movement"}, "sparsity"),
                         ({"method": "ffn", "sparsity": 0.5}, "method")):
        with pytest.raises(OptionsError) as refused:
            SparseConfig(**given)
        assert refused.value.field == field
    assert SCHEDULE == ("start", "end", "scores_lr_scale", "soft_lambda")
    assert _prune(tuned[0], tuned[1], tmp_path / "o", "magnitude", "0.5", "--train", str(tuned[1]),
                  "sparsity=0.9") == 2
    assert "unknown option sparsity" in _one_line_error(capsys)  # --sparsity is the one way to say it


@pytest.mark.parametrize("method, given, field", [("magnitude", "scores_lr_scale=10", "scores_lr_scale"),
                                                  ("magnitude", "soft_lambda=1", "soft_lambda"),
                                                  ("movement", "soft_lambda=1", "soft_lambda")])
def test_a_schedule_setting_the_method_does_not_read_is_refused_in_both_faces(tuned, tmp_path, capsys, method,
                                                                              given, field):
    from lmforge.compress.sparse_finetune import SparseConfig
    from lmforge.config.options import OptionsError

    key, value = given.split("=")
    with pytest.raises(OptionsError) as refused:
        SparseConfig(method=method, sparsity=0.5, **{key: float(value)})
    assert refused.value.field == field and f"not {method}" in str(refused.value)
    assert _prune(tuned[0], tuned[1], tmp_path / "o", method, "0.5", "--train", str(tuned[1]), given) == 2
    assert field in _one_line_error(capsys) and not (tmp_path / "o").exists()
    SparseConfig(method="soft-movement", sparsity=0.5, scores_lr_scale=10, soft_lambda=1)  # read there


def test_a_validation_setting_without_valid_is_refused_naming_it(tuned, tmp_path, capsys):
    assert _prune(tuned[0], tuned[1], tmp_path / "o", "magnitude", "0.5", "--train", str(tuned[1]),
                  "eval_every=3") == 2  # no --valid: nothing would be evaluated every 3 steps
    assert "eval_every=3: a setting of validation" in _one_line_error(capsys)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("method", ["heads", "movement"])
def test_a_missing_model_is_named_by_its_flag_before_any_output_folder_is_made(tmp_path, capsys, method):
    """The unstructured methods reached load_model, whose refusal names the Python argument."""
    dev = tmp_path / "dev.jsonl"
    dev.write_text('{"text": "a", "label": "1"}\n')
    extra = ["--train", str(dev)] if method == "movement" else []
    assert _prune(tmp_path / "nope", dev, tmp_path / "out", method, "0.5", *extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--model {tmp_path / 'nope'}: no such directory" in err
    assert not (tmp_path / "out").exists()


def test_a_flag_wins_over_key_value_and_the_config_file(tuned, tmp_path, monkeypatch):
    import lmforge.compress.sparse_finetune as sparse
    from lmforge.train.config import evaluated_every

    class Captured(Exception):
        """The stand-in training run's options."""

    def run(*args, train_cfg, **kwargs):
        raise Captured(train_cfg)

    monkeypatch.setattr(sparse, "run_sparse_prune", run)
    model, dev = tuned
    (tmp_path / "c.yaml").write_text("steps: 20\nseed: 7\nwarmup: 5\n")
    extra = ["--train", str(dev), "--valid", str(dev), "--config", str(tmp_path / "c.yaml")]
    with pytest.raises(Captured) as got:
        _prune(model, dev, tmp_path / "a", "magnitude", "0.5", *extra, "--steps", "10", "--seed", "3",
               "warmup=1")
    # eval_every left to the run: a tenth of its steps where it validates (train.config.evaluated_every)
    given = got.value.args[0]
    assert [getattr(given, k) for k in ("steps", "seed", "warmup", "eval_every")] == [10, 3, 1, None]
    assert evaluated_every(got.value.args[0], True).eval_every == 1
    with pytest.raises(Captured) as got:  # the file's steps set how often to validate, as --steps would
        _prune(model, dev, tmp_path / "b", "magnitude", "0.5", *extra)
    assert [getattr(got.value.args[0], k) for k in ("steps", "seed", "warmup")] == [20, 7, 5]
    assert evaluated_every(got.value.args[0], True).eval_every == 2


@pytest.mark.parametrize("method, extra, named", [
    ("ffn", ["--sparsity", "1e400"], "--sparsity 1e400: must be"),
    ("heads", ["--sparsity", "0"], "--sparsity 0: must be"),
    ("movement", ["--sparsity", "0.5", "--train", "/missing.jsonl", "lr=0"], "lr must be"),
    ("magnitude", ["--sparsity", "2", "--train", "/missing.jsonl"], "--sparsity 2: must be")])
def test_a_bad_option_is_named_before_the_missing_model_or_files(tmp_path, monkeypatch, capsys, method, extra,
                                                                 named):
    monkeypatch.chdir(tmp_path)
    assert main(["prune", "--model", "/missing", "--method", method, "--data", "/missing.jsonl", "--out", "o",
                 *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and "/missing" not in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("resume", [False, True])
def test_an_out_holding_a_run_s_checkpoints_exits_2_naming_out_before_the_model_is_read(tmp_path, capsys,
                                                                                        resume):
    """Pruning during fine-tuning found it only at Trainer.fit, once the model was loaded and the records
    encoded (here the missing --model was named first); --resume gets past it to the model."""
    dev, out = tmp_path / "dev.jsonl", tmp_path / "run"
    dev.write_text('{"text": "a", "label": "1"}\n')
    (out / "checkpoints" / "step-0000002").mkdir(parents=True)
    assert _prune(tmp_path / "nope", dev, out, "movement", "0.5", "--train", str(dev),
                  *(["--resume"] if resume else [])) == 2
    err = _one_line_error(capsys)
    assert (f"--model {tmp_path / 'nope'}: no such directory" in err if resume else err ==
            f"lmforge prune: error: --out {out} already holds a run's checkpoints: pass resume=True "
            "(--resume) to continue it, or another folder\n")
