"""`--seed` fixes a pretraining run's initial weights: the same seed in two separate processes gives
bit-identical weights (model, heads, ELECTRA's generator), another seed other weights."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmforge.cli import main
from lmforge.data import corpus_text
from lmforge.model import from_config
from lmforge.presets import get_config
from lmforge.train.data import derive_seed
from lmforge.train.pretrain import init_seed, seeded_init

TINY = ["progress=false", "batch_size=2", "n_layers=1", "d_model=32", "n_heads=2", "d_ff=64",
        "max_seq_len=64"]
# the installed command beside the interpreter (.venv/bin/lmforge), else lmforge.cli.main through -c
SCRIPT = Path(sys.executable).with_name("lmforge")
COMMAND = [str(SCRIPT)] if SCRIPT.is_file() else [
    sys.executable, "-c", "import sys; from lmforge.cli import main; sys.exit(main(sys.argv[1:]))"]


def _run(args: list, cwd: Path) -> None:
    """`lmforge ARGS` in a process of its own, which must succeed."""
    done = subprocess.run(COMMAND + args, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONHASHSEED": "random"})
    assert done.returncode == 0, done.stderr[-2000:]


def _pretrain(tmp_path: Path, out: str, preset: str, objective: str, seed: int, here: bool = False) -> Path:
    """A 2-step run in a process of its own, or `here`: in this test's process, whose RNGs, hash
    seed and imports differ from a fresh one's (one process start is most of a tiny run's time)."""
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(corpus_text(30, seed=0))
    args = ["pretrain", "--preset", preset, "--objective", objective, "--steps", "2", "--seed", str(seed),
            "--data", str(corpus), "--out", str(tmp_path / out), *TINY]
    if here:
        torch.manual_seed(1234)  # whatever the caller's RNG holds, the seed decides
        assert main(args) == 0
    else:
        _run(args, tmp_path)
    return tmp_path / out


def _losses(run: Path) -> list:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _bytes(run: Path, *parts: str) -> bytes:
    return run.joinpath(*parts).read_bytes()


@pytest.mark.slow  # a second process (another hash seed); in one process: the ELECTRA test below
def test_the_same_seed_in_two_processes_gives_the_same_mlm_model(tmp_path):
    a = _pretrain(tmp_path, "A", "bert-tiny", "mlm", 0)
    b, c = (_pretrain(tmp_path, out, "bert-tiny", "mlm", seed, here=True)
            for out, seed in (("B", 0), ("C", 1)))
    assert _bytes(a, "final", "model.safetensors") == _bytes(b, "final", "model.safetensors")
    assert _bytes(a, "final", "model.safetensors") != _bytes(c, "final", "model.safetensors")
    assert _losses(a) == _losses(b) != _losses(c)


def test_the_same_seed_gives_the_same_electra_generator_and_discriminator(tmp_path):
    a, b = (_pretrain(tmp_path, out, "electra-small", "rtd", 0, here=True) for out in ("A", "B"))
    assert _bytes(a, "final", "model.safetensors") == _bytes(b, "final", "model.safetensors")
    # the checkpoint holds the whole objective: the generator (never saved in final/) as well
    step = "step-0000002"
    weights = _bytes(a, "checkpoints", step, "model.safetensors")
    assert b"generator." in weights and weights == _bytes(b, "checkpoints", step, "model.safetensors")


def test_seeded_init_ignores_and_keeps_the_callers_rng():
    cfg = get_config("bert-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=50)
    models = []
    for state in (1, 2):
        torch.manual_seed(state)
        before = torch.random.get_rng_state()
        with seeded_init(7):
            models.append(from_config(cfg).state_dict())
        assert torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])


@pytest.mark.parametrize("stream", [(6,), (0, 1), (6, 0, 1), (6, 0, 0, 3)])
def test_the_init_seed_is_no_other_streams_seed(stream):
    # data order (seed, epoch), evaluation (seed, i, 2), corruption and dropout (four parts)
    assert init_seed(0) != derive_seed(0, *stream)


def test_the_same_seed_writes_byte_identical_checkpoints_whatever_python_s_and_numpy_s_rngs(tmp_path):
    """A checkpoint records Python's and NumPy's RNG states; each seeds itself from the OS in a new process,
    so the training step seeds them from the run's seed as it does torch's."""
    import random

    import numpy as np

    from lmforge.train import Trainer
    from tests.train.helpers import mlm_objective, quick, toy_data

    for out, noise in (("a", 1), ("b", 2)):
        random.seed(noise)
        np.random.seed(noise)
        Trainer(mlm_objective(), toy_data(16), quick(steps=1), tmp_path / out).fit()
    step = ("checkpoints", "step-0000001")
    for name in ("optimizer.pt", "trainer.json", "model.safetensors"):
        assert _bytes(tmp_path / "a", *step, name) == _bytes(tmp_path / "b", *step, name), name


def _draws() -> tuple:
    import random

    import numpy as np

    cuda = torch.rand(3, device="cuda").tolist() if torch.cuda.is_available() else None  # a GPU run's too
    return torch.rand(3).tolist(), random.random(), np.random.random_sample(3).tolist(), cuda


@pytest.mark.parametrize("fails", [False, True])
def test_training_leaves_the_callers_global_rngs_as_they_were_whether_it_returns_or_raises(tmp_path, fails):
    """Each step reseeds torch's, Python's and NumPy's global RNGs from the run's seed; fit puts the
    caller's states back, so a caller's next draws are the ones it would have made without training."""
    import random

    import numpy as np

    from lmforge.train import Trainer
    from tests.train.helpers import mlm_objective, quick, toy_data

    trainer = Trainer(mlm_objective(), toy_data(16), quick(steps=2), tmp_path)
    if fails:
        trainer.save = lambda: (_ for _ in ()).throw(RuntimeError("stopped at the save"))
    torch.manual_seed(11), random.seed(12), np.random.seed(13)  # torch's seeds CUDA's too
    expected = _draws()
    torch.manual_seed(11), random.seed(12), np.random.seed(13)
    if fails:
        with pytest.raises(RuntimeError, match="stopped at the save"):
            trainer.fit()
    else:
        trainer.fit()
    assert trainer.step == 2 and _draws() == expected
