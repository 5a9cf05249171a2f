"""Fine-tuning with validation under torchrun: two gloo processes sharding the model with FSDP validate, keep
best/ and write final/ as one process does with the same global batch (the validator calls the model outside
FSDP's root forward: its weights are gathered for it, and best/ from every rank's gather)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from lmforge.tasks.finetune import finetune

from tests.tasks.core import cfg, quiet, sentiment, tiny, tokenizer

SCRIPT = textwrap.dedent("""
    import sys
    from lmforge.tasks.finetune import finetune
    from tests.tasks.core import quiet
    from tests.train.test_distributed_finetune import run_args
    finetune(*run_args(sys.argv[1], parallel="fsdp"), log=quiet)
""")


def run_args(out, **train) -> tuple:
    """finetune's arguments: a one-layer BERT without dropout (ranks draw their own), 16 records, 8 to
    validate on after each of 3 steps of 8 examples, `train` over the training options."""
    data = sentiment()
    options = {"steps": 3, "batch_size": 4, "eval_every": 1, **train}
    return (tiny(n_layers=1, dropout=0.0, attention_dropout=0.0), tokenizer(), "cls", data["train"][:16],
            data["validation"][:8], out, cfg(**options))


@pytest.mark.slow  # two processes and a gloo group: seconds; CI runs it (make test-slow)
def test_fsdp_with_validation_equals_one_process_with_the_same_global_batch(tmp_path):
    script = tmp_path / "finetune.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(script), str(tmp_path / "two")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    finetune(*run_args(tmp_path / "one", accumulation=2), log=quiet)
    one, two = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("one", "two"))
    assert two["steps"] == 3 and two["best_step"] == one["best_step"]
    for key in ("best", "final"):  # every evaluation's metrics: the same weights, whole, on the same records
        assert two[key].keys() == one[key].keys()
        for metric in one[key]:
            assert two[key][metric] == pytest.approx(one[key][metric], abs=1e-6), (key, metric)
    for folder in ("best", "final"):  # best/ is rank 0's write of the weights every rank gathered
        ours, theirs = (load_file(str(tmp_path / name / folder / "model.safetensors"))
                        for name in ("one", "two"))
        assert ours.keys() == theirs.keys()
        for k in ours:
            torch.testing.assert_close(theirs[k], ours[k], atol=1e-6, rtol=0, msg=f"{folder}: {k}")
