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
    import os, sys
    from safetensors.torch import save_file
    from lmforge.train import Trainer
    from tests.train.helpers import mlm_objective, quick, toy_data
    objective = mlm_objective(dropout=0.0, attention_dropout=0.0)
    config = quick(steps=10, batch_size=2, parallel=sys.argv[2])
    model = Trainer(objective, toy_data(), config, sys.argv[1]).fit()
    # what this rank holds (DDP: a whole replica; FSDP: its shard of each weight), for the test to compare
    own = {k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone().contiguous()
           for k, v in model.state_dict().items()}
    save_file(own, os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.safetensors"))
""")


def _held(full, rank: int, parallel: str):
    """The part of a full weight that `rank` holds: all of it (DDP), its dim-0 chunk (FSDP)."""
    if parallel == "ddp":
        return full
    chunks = torch.chunk(full, 2, dim=0)
    return chunks[rank] if rank < len(chunks) else full[:0]


# three process starts each: two processes equal one stays in the default suite with DDP; FSDP's
# sharded run is the same comparison, left to CI's `make test-slow`
@pytest.mark.slow  # two processes and a gloo group: seconds; CI runs it (make test-slow)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_gloo_processes_equal_one_process_with_the_same_global_batch(tmp_path, parallel):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(script), str(tmp_path / "two"), parallel], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    one = Trainer(mlm_objective(dropout=0.0, attention_dropout=0.0), toy_data(),
                  quick(steps=10, batch_size=2, accumulation=2), tmp_path / "one").fit()
    two = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    ours = {k: v for k, v in one.state_dict().items() if k in two}
    assert ours.keys() == two.keys()
    for k in ours:
        torch.testing.assert_close(two[k], ours[k], atol=1e-6, rtol=0, msg=k)
    # every rank ends with the weights rank 0 saved, not only rank 0 itself
    for rank in (0, 1):
        held = load_file(str(tmp_path / "two" / f"rank{rank}.safetensors"))
        assert two.keys() <= held.keys()
        for k in two:
            assert torch.equal(held[k], _held(two[k], rank, parallel)), (rank, k)
