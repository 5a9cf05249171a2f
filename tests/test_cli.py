import json

import pytest

import lmforge
from lmforge.cli import main


def test_inspect_preset(capsys):
    assert main(["inspect", "bert-base"]) == 0
    out = capsys.readouterr().out
    assert "108.89M backbone" in out and "23.83M embeddings" in out and "FLOPs/token" in out


def test_inspect_with_overrides_and_config_file(capsys, tmp_path):
    (tmp_path / "c.yaml").write_text("n_layers: 2\n")
    assert main(["inspect", "gpt2", "d_model=64", "n_heads=4", "--config", str(tmp_path / "c.yaml")]) == 0
    assert "layers         2" in capsys.readouterr().out


def test_inspect_model_directory(capsys, tmp_path):
    lmforge.build(lmforge.tiny("t5-small")).save(tmp_path)
    assert main(["inspect", str(tmp_path)]) == 0
    assert "encoder-decoder" in capsys.readouterr().out


def test_bad_input_exits_2_with_one_line(capsys):
    assert main(["inspect", "bert-bse"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean bert-base" in err
    assert main(["inspect", "gpt2", "n_heads=5"]) == 2
    assert "n_heads=5" in capsys.readouterr().err
    assert main(["inspect", "gpt2", "nonsense"]) == 2


# slow (pretraining, two fine-tunes and their plots in one run): each step is its command's own test
# (tests/test_pretrain.py, tests/tasks/test_task_cli.py); the whole job is CI's `make test-slow`
@pytest.mark.slow
def test_demo_runs_the_main_job_end_to_end(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--quick"]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["tasks"]) == {"sentiment", "tagging"}
    tokenizer = lmforge.load_tokenizer(tmp_path / "tokenizer")  # it spells the built-in questions too
    assert tokenizer.unk_id not in tokenizer.encode("Where was he born? When?").ids
    for runs in report["tasks"].values():
        assert set(runs) == {"pretrained", "from scratch"}
        assert all(0 <= run["test"][run["metric"]] <= 1 for run in runs.values())
    assert report["probes"]["trained"]["all"]["n"] == 800 and "mrr" in report["probes"]["trained"]["context"]
    assert lmforge.load(tmp_path / "sentiment-pretrained" / "final").heads
    assert (tmp_path / "demo.png").stat().st_size > 0 and (tmp_path / "pretrain" / "loss.png").is_file()
    assert "Pretrained vs from scratch" in capsys.readouterr().out
    assert main(["demo", "--out", str(tmp_path), "--quick"]) == 2  # never overwrites a run


def test_demo_refuses_an_out_that_is_no_folder_naming_it(tmp_path, capsys):
    (tmp_path / "data.jsonl").write_text("{}\n")
    for out in ("data.jsonl", "data.jsonl/run", ""):
        assert main(["demo", "--quick", "--out", str(tmp_path / out) if out else out]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--out" in err and "Errno" not in err, err
    assert (tmp_path / "data.jsonl").read_text() == "{}\n"


def test_convert_both_ways(tmp_path, capsys):
    import torch

    from lmforge.heads import attach

    model = lmforge.build(lmforge.tiny("gpt2")).eval()
    attach(model, "lm")
    model.save(tmp_path / "ours")
    assert main(["convert", str(tmp_path / "ours"), str(tmp_path / "hf"), "--to", "hf"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "gpt2"
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    back = lmforge.load(tmp_path / "back")
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "x")]) == 2


def test_a_closed_pipe_ends_the_command_quietly():
    """`lmforge options | head -1`: the reader leaving is no error to report (status 141, as SIGPIPE's)."""
    import subprocess
    import sys

    code = ("import os, sys; r, w = os.pipe(); os.close(r); os.dup2(w, 1); "
            "from lmforge.cli import main; sys.exit(main(['options']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 141 and done.stderr == "", done.stderr


def test_a_broken_pipe_other_than_stdout_is_an_error_like_any_other(monkeypatch, capsys):
    """Only a reader of stdout gone ends quietly; a socket's or a subprocess's broken pipe is reported."""
    from lmforge.cli import model

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(model, "cmd_inspect", broken)
    assert main(["inspect", "bert-tiny"]) == 2  # stdout here is pytest's capture, not a closed pipe
    assert "error: [Errno 32] Broken pipe" in capsys.readouterr().err


def test_presets_lists_every_preset_get_config_takes_and_version_says_the_package_s(capsys):
    from lmforge.presets import ELMO_PRESETS, PRESETS

    assert main(["presets"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [*PRESETS, *ELMO_PRESETS]  # ELMo's were missing though inspect elmo-small works
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"lmforge {lmforge.__version__}\n"


def test_an_unknown_model_is_told_the_installed_models_as_their_cards_write_them(capsys):
    assert main(["embed", "--model", "nope", "x"]) == 2
    assert capsys.readouterr().err.rstrip().endswith("nor a known model package (all-MiniLM-L6-v2)")


def test_ctrl_c_while_the_parser_is_built_ends_quietly(monkeypatch, capsys):
    """It printed a KeyboardInterrupt traceback (the parser's imports take a moment); 130, as after it."""
    import lmforge.cli as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["inspect", "bert-base"]) == 130
    assert capsys.readouterr().err == ""
