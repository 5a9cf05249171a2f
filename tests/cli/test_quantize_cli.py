"""`lmforge quantize` end to end: encoder-decoders timed with decoder inputs, nothing written when a
step fails, --out checked before any work, task.json carried, --seq-len / --seed / --task checked,
parameters counted as inspect counts them, and a table whose metric cells stay on their row."""
import json

import pytest

import lmforge
from lmforge.cli import main
from lmforge.heads import attach
from tests.tasks.core import sentiment, tiny, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny matrices, a busy second core
FAST = ["--batch-size", "1", "--seq-len", "8", "--rounds", "1"]


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    """(directory, dev file): a tiny BERT fine-tuned a few steps on the sentiment task, with task.json."""
    from lmforge.tasks.finetune import finetune
    from lmforge.train import TrainConfig

    out, data = tmp_path_factory.mktemp("sst"), sentiment(100)
    finetune(tiny("bert-base", n_layers=2, n_heads=4), tokenizer(), "cls", data["train"], None, out,
             TrainConfig(steps=2, batch_size=8, seed=0, log_every=100, progress=False), log=lambda *a: None)
    dev = out / "dev.jsonl"
    dev.write_text("".join(json.dumps(r) + "\n" for r in data["validation"][:16]))
    return out / "final", dev


@pytest.mark.parametrize("preset,family", [("t5-small", "t5"), ("bart-base", "gpt2")])
def test_an_encoder_decoder_is_quantised_end_to_end(tmp_path, preset, family):
    model = tiny(preset)
    attach(model, "lm")
    model.save(tmp_path / "src")
    tokenizer(family).save(tmp_path / "src")
    assert main(["quantize", "--model", str(tmp_path / "src"), "--out", str(tmp_path / "q"), *FAST]) == 0
    report = json.loads((tmp_path / "q" / "quantize.json").read_text())
    assert report["after"]["int8_layers"] > 0 and report["speedup"] > 0
    assert lmforge.load(tmp_path / "q" / "model").config.quantization["mode"] == "dynamic"


def test_a_fine_tuned_encoder_decoder_is_scored_before_and_after(tmp_path):
    from lmforge.tasks.finetune import finetune
    from lmforge.train import TrainConfig

    data = sentiment(100)
    finetune(tiny("t5-small"), tokenizer("t5"), "cls", data["train"], None, tmp_path / "ft",
             TrainConfig(steps=2, batch_size=8, seed=0, log_every=100, progress=False), log=lambda *a: None)
    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(json.dumps(r) + "\n" for r in data["validation"][:8]))
    source, out = str(tmp_path / "ft" / "final"), str(tmp_path / "q")
    assert main(["quantize", "--model", source, "--out", out, "--data", str(dev), *FAST]) == 0
    report = json.loads((tmp_path / "q" / "quantize.json").read_text())
    assert {"metric", "metric_name"} <= set(report["after"]) and report["after"]["int8_layers"] > 0
    assert main(["evaluate", "--model", str(tmp_path / "q" / "model"), "--data", str(dev)]) == 0


def test_a_failing_step_leaves_nothing_half_written(fine_tuned, tmp_path, monkeypatch, capsys):
    import lmforge.compress.quantize_report as report

    def broken(*args, **kwargs):
        raise ValueError("the timing failed")

    monkeypatch.setattr(report, "alternating", broken)
    path, _ = fine_tuned
    assert main(["quantize", "--model", str(path), "--out", str(tmp_path / "q"), *FAST]) == 2
    assert "timing failed" in capsys.readouterr().err
    assert not (tmp_path / "q").exists() or not any((tmp_path / "q").iterdir())


def test_out_is_checked_before_any_work(fine_tuned, tmp_path, capsys):
    path, _ = fine_tuned
    before = {f.name: f.read_bytes() for f in path.iterdir()}
    for out in (str(path), str(path.parent), ""):
        assert main(["quantize", "--model", str(path), "--out", out, *FAST]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--out" in err[0], err
    assert {f.name: f.read_bytes() for f in path.iterdir()} == before  # the source untouched


def test_task_json_travels_without_data_and_the_model_evaluates(fine_tuned, tmp_path):
    path, dev = fine_tuned
    assert main(["quantize", "--model", str(path), "--out", str(tmp_path / "q"), *FAST]) == 0
    assert json.loads((tmp_path / "q" / "model" / "task.json").read_text()) == json.loads(
        (path / "task.json").read_text())
    assert main(["evaluate", "--model", str(tmp_path / "q" / "model"), "--data", str(dev)]) == 0


def test_options_that_would_be_ignored_are_refused(fine_tuned, tmp_path, capsys):
    path, dev = fine_tuned
    base = ["quantize", "--model", str(path), "--out", str(tmp_path / "q")]
    cases = ((["--seq-len", "100000"], "--seq-len 100000"), (["--seed", "-1"], "--seed -1"),
             (["--task", "cls"], "--task"), (["--columns", "text=sentence"], "--columns"))
    for extra, named in cases:
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and named in err[0], (extra, err)
    assert not (tmp_path / "q").exists()


def test_the_seed_draws_the_calibration_and_timing_tokens(fine_tuned, tmp_path, monkeypatch):
    import lmforge.compress.quantize_report as report

    ids, drawn = [], report.random_tokens

    def spy(*args):
        ids.append(drawn(*args)[0])
        return drawn(*args)

    monkeypatch.setattr(report, "random_tokens", spy)
    path, _ = fine_tuned
    for seed in ("0", "0", "1"):
        out = str(tmp_path / seed)
        assert main(["quantize", "--model", str(path), "--out", out, "--seed", seed, *FAST]) == 0
    weights = [(tmp_path / s / "model" / "model.safetensors").read_bytes() for s in ("0", "1")]
    assert ids[0].equal(ids[1]) and not ids[0].equal(ids[2])  # the timed batch follows --seed
    assert weights[0] != weights[1]  # so does the smoothing calibrated on random tokens


def test_parameters_are_counted_as_inspect_counts_them_and_cells_stay_on_their_row(fine_tuned, tmp_path,
                                                                                     capsys):
    path, dev = fine_tuned
    out = str(tmp_path / "q")
    assert main(["quantize", "--model", str(path), "--out", out, "--data", str(dev), *FAST]) == 0
    report = json.loads((tmp_path / "q" / "quantize.json").read_text())
    backbone = lmforge.load(path).num_parameters()  # heads excluded, as inspect, prune and distill count
    assert report["before"]["parameters"] == report["after"]["parameters"] == backbone
    assert "heads excluded" in report["parameters_counted"]
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "before" in line or "after" in line]
    assert any("accuracy" in line for line in out.splitlines()) and len(rows) == 2
    for name, row in zip(("before", "after"), rows):
        assert f"{report[name]['metric']:.4f}" in row and f"{backbone:,}" in row


def test_an_existing_model_folder_is_replaced_whole_and_said_and_task_json_gets_the_umask_mode(
        fine_tuned, tmp_path, capsys):
    import os
    import shutil
    import stat

    path, _ = fine_tuned
    source = tmp_path / "src"
    shutil.copytree(path, source)
    os.chmod(source / "task.json", 0o600)  # copied by content: the copy's mode is a new file's
    stale = tmp_path / "q" / "model"
    (stale / "1_Pooling").mkdir(parents=True)
    (stale / "keep.txt").write_text("old")
    (tmp_path / "q" / "notes.txt").write_text("beside")
    before = os.umask(0o022)
    try:
        assert main(["quantize", "--model", str(source), "--out", str(tmp_path / "q"), *FAST]) == 0
    finally:
        os.umask(before)
    out = capsys.readouterr().out
    assert f"{stale} existed: replaced as a whole" in out
    assert not (stale / "keep.txt").exists() and not (stale / "1_Pooling").exists()
    assert (tmp_path / "q" / "notes.txt").read_text() == "beside"
    assert stat.S_IMODE((stale / "task.json").stat().st_mode) == 0o644
    assert main(["quantize", "--model", str(source), "--out", str(tmp_path / "q2"), *FAST]) == 0
    assert "existed" not in capsys.readouterr().out


def test_no_activation_bits_are_claimed_where_every_layer_ran_fp32(fine_tuned, tmp_path, monkeypatch, capsys):
    from lmforge.quant import int8, int8_ffn

    path, _ = fine_tuned
    monkeypatch.setattr(int8, "CHOICES", {})
    monkeypatch.setattr(int8.Int8Linear, "_measure", lambda self, key, x: "fp32")  # as a tiny model measures
    # the fused FFN route quantises the hidden units whatever its layers chose: measured plain here (on a
    # busy machine it could win, and the report rightly claims its bits)
    monkeypatch.setattr(int8_ffn, "CHOICES", {})
    monkeypatch.setattr(int8_ffn, "_choose", lambda ffn, key, rows: "plain")
    assert main(["quantize", "--model", str(path), "--out", str(tmp_path / "q"), "--rounds", "1"]) == 0
    report = json.loads((tmp_path / "q" / "quantize.json").read_text())
    assert {k["kernel"] for k in report["kernels"]} == {"fp32"} and report["activation_bits"] is None
    assert "no activation quantised here" in capsys.readouterr().out


def test_the_words_for_unquantised_layers_say_what_their_kernel_multiplied(capsys):
    """w8a32 forms no fp32 weight (int8 widened in registers, the scale applied to each sum): said so."""
    from lmforge.cli.quantize import _table

    side = {"parameters": 10, "int8_layers": 1, "bytes": 100, "seconds": 0.1}
    report = {"mode": "dynamic", "batch": [2, 16], "threads": 1, "before": side, "after": side,
              "kernels": [{"kernel": "w8a32-serial"}, {"kernel": "w8a32"}, {"kernel": "fp32"}],
              "activation_bits": None, "parameters_counted": "all", "speedup": 1.0, "size_ratio": 0.5}
    _table(report)
    said = capsys.readouterr().out.splitlines()[-1]
    assert "fp32 activations by a dequantised fp32 copy of its weight (fp32) or its int8 weight widened to " \
        "fp32 in registers, the scale applied to the sum (w8a32)" in said
    report["kernels"] = [{"kernel": "w8a32"}]
    _table(report)
    said = capsys.readouterr().out.splitlines()[-1]
    assert "dequantised" not in said and "(w8a32), measured faster" in said


def test_kernels_read_back_from_the_machine_store_are_said_not_left_without_times(fine_tuned, tmp_path,
                                                                                 monkeypatch, capsys):
    from lmforge.quant import int8, kernel_store
    from lmforge.utils import timing

    store = tmp_path / "kernels.json"
    monkeypatch.setenv(kernel_store.ENV, str(store))
    monkeypatch.setattr(timing, "BUSY_SHARE", float("inf"))  # kept on any load (the busy rule: its own test)
    outs = []
    for run in ("first", "second"):  # the second as a later process: nothing of the first kept in memory
        monkeypatch.setattr(int8, "CHOICES", {})
        monkeypatch.setattr(int8, "TIMINGS", {})
        assert main(["quantize", "--model", str(fine_tuned[0]), "--out", str(tmp_path / run), *FAST]) == 0
        kernels = json.loads((tmp_path / run / "quantize.json").read_text())["kernels"]
        outs.append((kernels, capsys.readouterr().out))
    (first, said_first), (second, said_second) = outs
    assert all("ms" in k and "kept_in" not in k for k in first) and "measured before" not in said_first
    assert [k["kernel"] for k in second] == [k["kernel"] for k in first]
    assert all(k["kept_in"] == str(store) and "ms" not in k for k in second)
    assert f"kernels as measured before on this machine ({store}: delete it to measure again)" in said_second


@pytest.mark.parametrize("fields, flags, named", [
    ({"seq_len": 0}, ["--seq-len", "0"], "--seq-len 0: must be"),
    ({"alpha": 1.5}, ["--smooth-alpha", "1.5"], "--smooth-alpha 1.5: must be a finite number >= 0 and <= 1"),
    ({"alpha": float("nan")}, ["--smooth-alpha", "nan"], "--smooth-alpha nan"),
    ({"seed": -1}, ["--seed", "-1"], "--seed -1: must be in"),
    # smoothing with weight-only: refused alike, by value (its default changes nothing, so both pass it)
    ({"alpha": 0.5, "mode": "weight-only"}, ["--mode", "weight-only", "--smooth-alpha", "0.5"],
     "--smooth-alpha 0.5: smoothing is for mode dynamic (weight-only quantises no activations)"),
    # the timed tokens are bounded together: each flag is within its own bounds here
    ({"seq_len": 512, "batch_size": 4096}, ["--batch-size", "4096", "--seq-len", "512"],
     "--seq-len 512: 2097152 tokens in the timed batch (4096 rows of 512), over 65536"),
    ({"rounds": 100, "batch_size": 512, "seq_len": 128},
     ["--rounds", "100", "--batch-size", "512", "--seq-len", "128"],
     "--rounds 100: 6553600 tokens timed (100 rounds of 65536), over 1048576"),
])
def test_python_and_the_command_line_refuse_the_same_quantize_options(tmp_path, capsys, fields, flags, named):
    from lmforge.compress.quantize_options import QuantizeOptions
    from lmforge.config.options import OptionsError

    with pytest.raises(OptionsError) as refused:
        QuantizeOptions(**fields)
    assert refused.value.field == next(iter(fields))
    assert main(["quantize", "--model", "m", "--out", str(tmp_path / "q"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err
    assert not (tmp_path / "q").exists()


def test_without_seq_len_the_timed_batch_is_bounded_at_the_model_s_length(fine_tuned, tmp_path, capsys):
    from lmforge.compress.quantize_options import QuantizeOptions

    import lmforge

    path = fine_tuned[0]
    length = min(128, lmforge.load(path).config.max_seq_len)  # the timed rows: the model's longest, <= 128
    assert QuantizeOptions(batch_size=4096).batch_size == 4096  # judged once the model is read
    assert main(["quantize", "--model", str(path), "--out", str(tmp_path / "q"), "--batch-size", "4096"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"lmforge quantize: error: --batch-size 4096: {4096 * length} tokens in the timed batch "
                   f"(4096 rows of {length}), over 65536"] and not (tmp_path / "q").exists()


def test_the_timed_tokens_bound_admits_its_largest_batch_and_rounds():
    from lmforge.compress.quantize_options import MAX_BATCH_TOKENS, MAX_TIMED_TOKENS, QuantizeOptions

    assert QuantizeOptions(batch_size=MAX_BATCH_TOKENS // 512, seq_len=512, rounds=16).rounds == 16
    assert QuantizeOptions(batch_size=1, seq_len=1, rounds=1000).rounds * 1 <= MAX_TIMED_TOKENS
    assert QuantizeOptions(batch_size=512).batch_size * 128 == MAX_BATCH_TOKENS  # a default seq_len: 128


def test_the_command_line_s_defaults_are_the_python_defaults():
    from lmforge.cli import build_parser
    from lmforge.cli.quantize import quantize_options
    from lmforge.compress.quantize_options import QuantizeOptions

    args = build_parser().parse_args(["quantize", "--model", "m", "--out", "o"])
    assert quantize_options(args) == QuantizeOptions()
    args = build_parser().parse_args(["quantize", "--model", "m", "--out", "o", "--no-smooth",
                                      "--rounds", "2"])
    assert quantize_options(args) == QuantizeOptions(alpha=None, rounds=2)


def test_smoothing_settings_with_weight_only_are_judged_by_value_alike_and_calibration_text_refused(tmp_path,
                                                                                                      capsys):
    from lmforge.cli import build_parser
    from lmforge.cli.quantize import quantize_options
    from lmforge.compress.quantize_options import QuantizeOptions
    from lmforge.compress.smooth import ALPHA

    base = ["quantize", "--model", "m", "--out", "o", "--mode", "weight-only"]
    for flags, alpha in ((["--smooth-alpha", str(ALPHA)], ALPHA), (["--no-smooth"], None)):  # change nothing
        given = quantize_options(build_parser().parse_args(base + flags))
        assert given == QuantizeOptions("weight-only", alpha)
    text = tmp_path / "c.txt"
    text.write_text("a calibration text\n")
    for mode, said in (("weight-only", "smoothing is for --mode dynamic"), ("dynamic", "smoothing is off")):
        extra = ["--no-smooth"] if mode == "dynamic" else []
        argv = ["quantize", "--model", "m", "--out", str(tmp_path / "q"), "--mode", mode, "--calibration",
                str(text), *extra]
        assert main(argv) == 2
        assert capsys.readouterr().err.strip() == f"lmforge quantize: error: --calibration: {said}" + \
            (" (weight-only quantises no activations)" if mode == "weight-only" else " (--no-smooth)")


def test_a_damaged_tokenizer_is_refused_naming_it_and_a_model_without_one_is_quantised(tmp_path, capsys):
    """It was left out of the int8 model unsaid (every error of reading it was taken for "no tokenizer")."""
    lmforge.save(tiny(n_layers=1), tmp_path / "bare")
    assert main(["quantize", "--model", str(tmp_path / "bare"), "--out", str(tmp_path / "q0"), *FAST]) == 0
    written = sorted(p.name for p in (tmp_path / "q0" / "model").iterdir())
    assert written == ["config.json", "model.safetensors"]
    (tmp_path / "c.txt").write_text("a calibration text\n")  # smoothing texts need the tokenizer it lacks
    assert main(["quantize", "--model", str(tmp_path / "bare"), "--out", str(tmp_path / "q1"), *FAST,
                 "--calibration", str(tmp_path / "c.txt")]) == 2
    assert capsys.readouterr().err.startswith("lmforge quantize: error: --calibration needs the model's")
    lmforge.save(tiny(n_layers=1), tmp_path / "m")
    tokenizer().save(tmp_path / "m")
    text = (tmp_path / "m" / "tokenizer.json").read_text()
    for damaged in (text.replace('"[UNK]": 1', '"[UNK]": 0', 1), text[: len(text) // 2]):  # still JSON; cut
        assert damaged != text
        (tmp_path / "m" / "tokenizer.json").write_text(damaged)
        capsys.readouterr()
        assert main(["quantize", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "q"), *FAST]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(tmp_path / "m" / "tokenizer.json") in err, err
        assert not (tmp_path / "q").exists()


def test_the_task_json_an_int8_model_carries_is_verified_on_both_sides(fine_tuned, tmp_path, capsys):
    """It was copied as found (an edited one carried on) and then read unverified in the int8 folder."""
    import shutil

    path, dev = fine_tuned
    assert main(["quantize", "--model", str(path), "--out", str(tmp_path / "q"), *FAST]) == 0
    carried = tmp_path / "q" / "model" / "task.json"
    assert "task.json" in json.loads((tmp_path / "q" / "model" / "config.json").read_text())["sha256"]
    carried.write_text(carried.read_text().replace('"max_len": 128', '"max_len": 129'))
    assert main(["evaluate", "--model", str(tmp_path / "q" / "model"), "--data", str(dev)]) == 2
    assert f"{carried} does not match its checksum" in capsys.readouterr().err
    shutil.copytree(path, tmp_path / "edited")
    (tmp_path / "edited" / "task.json").write_text(carried.read_text())
    assert main(["quantize", "--model", str(tmp_path / "edited"), "--out", str(tmp_path / "q2"), *FAST]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "edited/task.json does not match its checksum" in err and \
        not (tmp_path / "q2").exists(), err


def test_calibration_text_is_read_only_as_far_as_its_kept_lines_and_bad_bytes_name_their_line(tmp_path):
    """The whole file was read (a huge one for 512 lines), and bad bytes were a raw codec message."""
    from lmforge.cli.common import UsageError
    from lmforge.cli.quantize import _calibration
    from lmforge.compress.smooth import CALIBRATION_TEXTS

    path = tmp_path / "c.txt"
    path.write_bytes(b"\n".join(b"text %d" % n for n in range(CALIBRATION_TEXTS)) + b"\n\xff never read\n")
    assert _calibration(str(path)) == [f"text {n}" for n in range(CALIBRATION_TEXTS)]
    path.write_bytes(b"fine\n\n\xff bad\n")
    with pytest.raises(UsageError,
                       match=r"^--calibration .*c\.txt:3: not valid UTF-8 \(byte 0xff at column 1"):
        _calibration(str(path))


def test_a_huge_calibration_line_is_read_only_as_far_as_calibration_reads_it(tmp_path):
    """One line of a file was read whole into memory (and tokenised whole), whatever its size."""
    from lmforge.cli.quantize import _calibration
    from lmforge.compress.smooth import CALIBRATION_LENGTH, TOKEN_CHARS
    path, bound = tmp_path / "c.txt", 4 * CALIBRATION_LENGTH * TOKEN_CHARS
    path.write_bytes(b"a" + "é".encode() * bound + b"\nnext line\n")  # 2 bytes a character: one cut
    texts = _calibration(str(path))
    assert texts == ["a" + "é" * ((bound - 1) // 2), "next line"]  # the cut character dropped; line 2 read
