"""Pruning during fine-tuning: the settings a resume is checked against are the run's own."""
import json

import pytest

from lmforge.compress.sparse_finetune import SETTINGS, check_settings


def test_a_fresh_run_after_a_killed_first_save_records_its_own_settings(tmp_path):
    check_settings(tmp_path, {"--sparsity": 0.5, "--steps": 6}, resume=False)
    (tmp_path / "checkpoints" / ".step-0000002.tmp").mkdir(parents=True)  # killed in its first save
    check_settings(tmp_path, {"--sparsity": 0.7, "--steps": 4}, resume=False)  # started afresh
    assert json.loads((tmp_path / SETTINGS).read_text())["--sparsity"] == 0.7
    check_settings(tmp_path, {"--sparsity": 0.7, "--steps": 4}, resume=True)  # the run's: accepted
    with pytest.raises(ValueError, match="--sparsity 0.5 differs from the run being resumed .*--sparsity 0.7"):
        check_settings(tmp_path, {"--sparsity": 0.5, "--steps": 6}, resume=True)
