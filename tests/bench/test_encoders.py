"""bench.encoders' own entry point: the encoder suite alone, written with the machine it ran on."""
import json
import sys

import pytest


@pytest.mark.slow
def test_quick_run_writes_its_rows_and_machine(tmp_path, monkeypatch):
    from bench import encoders

    out = tmp_path / "encoders.json"
    monkeypatch.setattr(sys, "argv", ["bench.encoders", "--quick", "--repeats", "1", "--out", str(out),
                                      "--note", "a trial"])
    encoders.main()
    result = json.loads(out.read_text())
    machine = result["machine"]
    assert result["note"] == "a trial" and machine["cores"] >= 1 and isinstance(machine["cpu_flags"], list)
    rows = result["rows"]
    assert {(r["model"], r["lengths"]) for r in rows} == {("bert-mini", "all 128"), ("bert-mini", "uniform 8..128")}
    assert all(r["max_abs_diff"] < 1e-4 and r["ratio"] > 0 for r in rows)  # the same outputs as the reference
    assert not list(tmp_path.glob("*.tmp"))  # written atomically
