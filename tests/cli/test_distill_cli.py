"""`lmforge distill`: which of a flag, a key=value and the --config file gives a training option."""
import json

import pytest

from lmforge.cli import main
from tests.tasks.core import fine_tuned_sentiment

pytestmark = pytest.mark.usefixtures("one_thread")


class Captured(Exception):
    """Raised by a stand-in for the distillation run, carrying its training options."""


def test_a_flag_wins_over_key_value_which_wins_over_the_config_file(tmp_path, monkeypatch):
    import lmforge.compress.task_distillation as distillation
    from lmforge.train.config import evaluated_every

    def run(*args, train_cfg, **kwargs):
        raise Captured(train_cfg)

    monkeypatch.setattr(distillation, "run_distill", run)
    teacher, data = fine_tuned_sentiment(tmp_path / "sst")
    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(json.dumps(r) + "\n" for r in data["validation"][:16]))
    (tmp_path / "c.yaml").write_text("steps: 20\nseed: 7\nwarmup: 5\n")
    base = ["distill", "--teacher", str(teacher), "--train", str(dev), "--valid", str(dev),
            "--config", str(tmp_path / "c.yaml"), "--out"]
    with pytest.raises(Captured) as got:
        main([*base, str(tmp_path / "a"), "--steps", "10", "--seed", "3", "warmup=1"])
    # eval_every left to the run: a tenth of its steps where it validates (train.config.evaluated_every)
    given = got.value.args[0]
    assert [getattr(given, k) for k in ("steps", "seed", "warmup", "eval_every")] == [10, 3, 1, None]
    assert evaluated_every(got.value.args[0], True).eval_every == 1
    with pytest.raises(Captured) as got:  # the file's steps set how often to validate, as --steps would
        main([*base, str(tmp_path / "b")])
    assert [getattr(got.value.args[0], k) for k in ("steps", "seed", "warmup")] == [20, 7, 5]
    assert evaluated_every(got.value.args[0], True).eval_every == 2


@pytest.mark.parametrize("extra, named", [
    (["temperature=-1"], "temperature must be"),
    (["lr=0"], "lr must be"),
    (["--student-layers", "0"], "--student-layers 0"),
])
def test_a_bad_option_is_named_before_the_missing_teacher_or_files(tmp_path, monkeypatch, capsys, extra,
                                                                  named):
    monkeypatch.chdir(tmp_path)
    assert main(["distill", "--teacher", "/missing", "--train", "/missing.jsonl", "--data", "/missing.jsonl",
                 "--out", "o", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and "/missing" not in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("resume", [False, True])
def test_an_out_holding_a_run_s_checkpoints_exits_2_naming_out_before_the_teacher_is_read(tmp_path, capsys,
                                                                                         resume):
    """It was refused by distill() (naming out, not --out) once the records were read, or by Trainer.fit
    once the teacher was loaded; --resume gets past it, to the missing --teacher."""
    out, teacher, dev = tmp_path / "run", tmp_path / "missing", tmp_path / "dev.jsonl"
    (out / "checkpoints" / "step-0000002").mkdir(parents=True)
    dev.write_text('{"text": "a", "label": "1"}\n')
    assert main(["distill", "--teacher", str(teacher), "--train", str(dev), "--data", str(dev), "--out",
                 str(out), "--steps", "1", *(["--resume"] if resume else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (f"--teacher {teacher}: not a fine-tuned model" in err if resume else
                                     err == f"lmforge distill: error: --out {out} already holds a run's "
                                     "checkpoints: pass resume=True (--resume) to continue it, or another "
                                     "folder\n")
