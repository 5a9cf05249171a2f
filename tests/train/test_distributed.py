import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from lmforge.train import Trainer

from tests.train.helpers import mlm_objective, quick, toy_data

SCRIPT = textwrap.dedent("""
    import sys
    from lmforge.train import Trainer
    from tests.train.helpers import mlm_objective, quick, toy_data
    objective = mlm_objective(dropout=0.0, attention_dropout=0.0)
    Trainer(objective, toy_data(), quick(steps=10, batch_size=2, parallel=sys.argv[2]), sys.argv[1]).fit()
""")


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_gloo_processes_equal_one_process_with_the_same_global_batch(tmp_path, parallel):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(script), str(tmp_path / "two"), parallel], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    one = Trainer(mlm_objective(dropout=0.0, attention_dropout=0.0), toy_data(),
                  quick(steps=10, batch_size=2, accumulation=2), tmp_path / "one").fit()
    two = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    ours = {k: v for k, v in one.state_dict().items() if k in two}
    assert ours.keys() == two.keys()
    for k in ours:
        torch.testing.assert_close(two[k], ours[k], atol=1e-6, rtol=0, msg=k)
