"""quant/kernel_store: int8 kernel choices written down once per machine, read back by later processes."""
import json
import subprocess
import sys

import pytest
import torch

from lmforge.quant import int8, kernel_store
from lmforge.quant.isa import machine
from lmforge.utils import timing


@pytest.fixture
def store(tmp_path, monkeypatch):
    path = tmp_path / "kernels.json"
    monkeypatch.setenv(kernel_store.ENV, str(path))
    monkeypatch.setattr(timing, "BUSY_SHARE", float("inf"))  # on any load (the busy rule: its own test)
    monkeypatch.setattr(int8, "CHOICES", {})
    monkeypatch.setattr(int8, "TIMINGS", {})
    return path


def _layer(mode="dynamic"):
    torch.manual_seed(0)
    return int8.Int8Linear.from_linear(torch.nn.Linear(64, 48), mode).eval()


def test_a_choice_is_measured_once_and_written_down(store, monkeypatch):
    layer, x = _layer(), torch.randn(20, 64)
    with torch.no_grad():
        layer(x)
    key, chosen = next(iter(int8.CHOICES.items()))
    assert json.loads(store.read_text())[machine()] == {"|".join(map(str, int8.stored(key))): chosen}
    assert chosen in int8.choices()[0]["ms"]  # measured here: the report has the times
    monkeypatch.setattr(int8, "CHOICES", {})  # a new process: the written choice is taken, nothing timed
    monkeypatch.setattr(int8, "TIMINGS", {})
    monkeypatch.setattr(int8.Int8Linear, "_measure", lambda *a: pytest.fail("measured again"))
    with torch.no_grad():
        layer(x)
    assert int8.CHOICES[key] == chosen
    assert int8.choices()[0]["kept_in"] == str(store) and "ms" not in int8.choices()[0]  # said, not blank


def test_the_first_writer_wins_and_unknown_kernels_are_measured(store):
    key = ("dynamic", 64, 48, 64, 2)
    assert kernel_store.settle(key, "fbgemm") == "fbgemm"
    assert kernel_store.settle(key, "fp32") == "fbgemm"  # another process chose first: its choice runs
    assert kernel_store.recall(key) == "fbgemm"
    name = "|".join(map(str, int8.stored(key)))
    store.write_text(json.dumps({machine(): {name: "no-such-kernel"}}))
    chosen = _layer()._choose(key, torch.randn(40, 64))
    assert chosen in _layer().candidates() and kernel_store.recall(int8.stored(key)) == chosen  # measured


def test_a_choice_made_before_a_kernel_was_added_is_measured_again(store, monkeypatch):
    key = ("dynamic", 64, 48, 64, 2)
    old = (*key, "fp32+fbgemm+onednn")  # the kernels an earlier lmforge offered: onednn-u8 never timed
    kernel_store.settle(old, "fp32")
    calls = []
    monkeypatch.setattr(int8.Int8Linear, "_measure", lambda self, k, x: calls.append(k) or "fbgemm")
    assert _layer()._choose(key, torch.randn(40, 64)) == "fbgemm" and calls == [key]
    assert kernel_store.recall(int8.stored(key)) == "fbgemm" and kernel_store.recall(old) == "fp32"


def test_off_and_unreadable_files_measure_per_process(store, monkeypatch, capsys):
    monkeypatch.setenv(kernel_store.ENV, "off")
    assert kernel_store.store_path() is None and kernel_store.settle(("k",), "fp32") == "fp32"
    monkeypatch.setenv(kernel_store.ENV, str(store))
    store.write_text("{not json")
    assert kernel_store.recall(("k",)) is None and kernel_store.recall(("k",)) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "int8 kernel choices unreadable" in err and str(store) in err  # once
    assert kernel_store.settle(("k",), "fp32") == "fp32"  # written anew
    assert kernel_store.recall(("k",)) == "fp32"
    monkeypatch.setenv(kernel_store.ENV, str(store.parent))  # a folder: the file inside it
    assert kernel_store.store_path() == store.parent / kernel_store.NAME


def test_an_entry_naming_no_kernel_is_measured_again_and_replaced(store):
    layer, x = _layer(), torch.randn(40, 64)
    key = layer.key(40)
    name = "|".join(map(str, int8.stored(key)))
    store.write_text(json.dumps({machine(): {name: ["fp32"]}}))  # a hand-edited file: a list, not a name
    assert kernel_store.recall(int8.stored(key)) is None
    with torch.no_grad():
        out = layer(x)  # measured, not a traceback
    chosen = int8.CHOICES[key]
    assert chosen in layer.candidates(64) and kernel_store.recall(int8.stored(key)) == chosen
    assert torch.allclose(out, torch.nn.functional.linear(x, layer.weight, layer.bias), atol=0.05)


def test_a_written_kernel_that_no_longer_agrees_is_measured_again_and_replaced(store, monkeypatch):
    layer, x = _layer("weight-only"), torch.randn(20, 64)
    key = layer.key(20)
    kernel_store.settle(int8.stored(key), "dequantise")  # written by an earlier process
    run = int8.Int8Linear.run  # the kernel came to disagree since (a changed build or native library)
    monkeypatch.setattr(int8.Int8Linear, "run", lambda self, k, xs: run(self, k, xs) * (k != "dequantise"))
    with torch.no_grad():
        out = layer(x)
    reference = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert int8.CHOICES[key] != "dequantise" and (out - reference).norm() <= 1e-3 * reference.norm()
    assert kernel_store.recall(int8.stored(key)) == int8.CHOICES[key]  # the stale choice replaced


@pytest.mark.slow  # a process start each; the suite's fast half keeps the property's other tests
def test_two_processes_give_the_same_outputs(store):
    """The defect this fixes: the same checkpoint's outputs differed between processes that timed
    kernels differently. Two processes, each choosing, now agree bitwise."""
    code = ("import sys, torch; from lmforge.utils import timing; timing.BUSY_SHARE = float('inf'); "
            "from lmforge.quant.int8 import Int8Linear; torch.manual_seed(0); "
            "m = Int8Linear.from_linear(torch.nn.Linear(384, 384), 'dynamic'); x = torch.randn(300, 384); "
            "torch.save(m(x).detach(), sys.argv[1])")
    outs = []
    for i in range(2):
        subprocess.run([sys.executable, "-c", code, str(store.with_name(f"out{i}.pt"))], check=True,
                       env={**__import__("os").environ, kernel_store.ENV: str(store)}, timeout=120)
        outs.append(torch.load(store.with_name(f"out{i}.pt"), weights_only=True))
    assert torch.equal(outs[0], outs[1]) and len(json.loads(store.read_text())[machine()]) == 1


def test_side_by_side_timing_runs_without_autograd():
    """With autograd on, an Int8Linear takes its fp32 reference path: timing that would time fp32 twice."""
    from lmforge.utils.timing import alternating

    seen = []
    alternating({"a": lambda: seen.append(torch.is_grad_enabled()), "b": lambda: None}, rounds=2)
    assert seen and not any(seen)


def test_a_non_finite_input_does_not_write_its_fallback_down(store):
    """Every kernel disagrees on a row of NaN: the fallback is this call's, and a later process measures."""
    layer, x = _layer(), torch.randn(20, 64)
    x[:] = float("nan")
    with torch.no_grad():
        layer(x)
    assert not store.exists() or not json.loads(store.read_text()).get(machine())
    x = torch.randn(20, 64)
    x[3] = float("nan")  # one padding-like row: the others still judge the kernels
    int8.CHOICES.clear()
    with torch.no_grad():
        layer(x)
    assert next(iter(int8.CHOICES.values())) != "dequantise"


def test_a_written_kernel_this_layer_cannot_run_is_kept_for_the_layers_that_can(store):
    key = ("weight-only", 64, 48, 64, 2)
    kernel_store.settle(int8.stored(key), "int8pack-bf16-serial")
    layer = _layer("weight-only")
    layer.candidates = lambda bucket=1: ["fp32"]  # as an unaligned weight offers no int8pack-bf16
    assert layer._choose(key, torch.randn(40, 64)) == "fp32"
    assert kernel_store.recall(int8.stored(key)) == "int8pack-bf16-serial"  # not flipped between processes


def test_arm_machines_are_told_apart_by_their_cpu_part():
    from lmforge.quant.isa import parse_cpuinfo

    a = parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x41\n"
                      "CPU part\t: 0xd40\n")
    b = parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n")
    assert a != b and a["CPU part"] == "0xd40" and a["flags"] == ""
    assert parse_cpuinfo("model name : X\nflags : avx2\nmodel name : Y\n")["model name"] == "X"


class _Busy:
    busy, share = True, 0.5


def test_a_choice_measured_while_the_machine_was_busy_is_not_kept(store, capsys):
    key = ("dynamic", 64, 48, 64, 2)
    assert kernel_store.settle(key, "fbgemm", elsewhere=_Busy()) == "fbgemm"  # this process runs it
    assert kernel_store.recall(key) is None and not store.exists()  # the next one measures again
    assert "50% of the CPUs' time went to other work" in capsys.readouterr().err
    assert kernel_store.settle(key, "onednn", elsewhere=type("Quiet", (), {"busy": False})()) == "onednn"
    assert kernel_store.recall(key) == "onednn"


def test_a_link_planted_at_the_lock_is_not_followed(store, tmp_path, capsys):
    target = tmp_path / "elsewhere" / "victim"
    target.parent.mkdir()
    store.with_name(store.name + ".lock").symlink_to(target)
    assert kernel_store.settle(("k",), "fp32") == "fp32"  # this process's choice, said once
    assert not target.exists() and not target.parent.joinpath("victim").is_symlink()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "symbolic link" in err and "not kept" in err
    assert kernel_store.recall(("k",)) is None  # nothing written under a lock it could not take


def test_a_store_nested_past_the_parser_is_unreadable_not_a_crash(store, capsys):
    store.write_text("[" * 100_000 + "]" * 100_000)
    assert kernel_store.recall(("k",)) is None
    assert "int8 kernel choices unreadable" in capsys.readouterr().err
