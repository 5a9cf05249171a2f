"""bench.run --out: chosen suites run in this process and land in that file alone, machine named."""
import json

import pytest


@pytest.mark.slow
def test_out_writes_the_chosen_suites_and_leaves_the_report_alone(tmp_path):
    from bench import run

    report = run.HERE / "RESULTS.md"
    before = report.read_bytes() if report.is_file() else None
    out = tmp_path / "machine.json"
    assert run.main(["--quick", "--repeats", "1", "--only", "encoder", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result) == {"machine", "encoder"} and result["machine"]["cores"] >= 1
    rows = result["encoder"]["rows"]
    lengths = {(r["model"], r["lengths"]) for r in rows}
    assert lengths == {("bert-mini", "all 128"), ("bert-mini", "uniform 8..128")}
    assert all(r["max_abs_diff"] < 1e-4 and r["ratio"] > 0 for r in rows)  # the reference's outputs
    assert (report.read_bytes() if report.is_file() else None) == before
