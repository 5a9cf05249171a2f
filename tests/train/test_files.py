"""What a run writes and resumes from: no link written through, every resumed-from field checksummed,
a resume with nothing to resume refused, no output over an input."""
import json

import pytest
import torch

from lmforge.cli import main
from lmforge.cli.common import refuse_overwrite
from lmforge.retrieval.evaluate import write_table
from lmforge.train import Trainer
from lmforge.train.checkpoint import STATE_KEY, CheckpointCorrupt, read_checkpoint
from lmforge.train.loop import NothingToResume
from lmforge.utils.atomic import UnsafePath
from tests.train.helpers import mlm_objective, quick, toy_data


@pytest.fixture
def run(tmp_path):
    """A finished 4-step run with checkpoints at steps 2 and 4."""
    Trainer(mlm_objective(), toy_data(), quick(steps=4, save_every=2, keep_last=3), tmp_path).fit()
    return tmp_path


def _plant(folder, name, tmp_path):
    target = tmp_path / f"precious-{name}"
    target.write_text("the user's")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).symlink_to(target)
    return target


def test_a_link_at_metrics_jsonl_is_refused_in_one_line_and_its_target_kept(tmp_path):
    target = _plant(tmp_path / "out", "metrics.jsonl", tmp_path)
    with pytest.raises(UnsafePath, match="metrics.jsonl: is a symbolic link"):
        Trainer(mlm_objective(), toy_data(), quick(steps=1), tmp_path / "out").fit()
    assert target.read_text() == "the user's"


def test_a_link_at_loss_png_or_an_eval_output_is_replaced_not_written_through(tmp_path):
    png = _plant(tmp_path / "out", "loss.png", tmp_path)
    Trainer(mlm_objective(), toy_data(), quick(steps=1), tmp_path / "out").fit()
    assert png.read_text() == "the user's" and not (tmp_path / "out" / "loss.png").is_symlink()
    recall = _plant(tmp_path / "eval", "recall.json", tmp_path)
    write_table({"bm25": {"recall@1": 0.5}}, tmp_path / "eval" / "recall.json")
    assert recall.read_text() == "the user's"
    assert json.loads((tmp_path / "eval" / "recall.json").read_text()) == {"bm25": {"recall@1": 0.5}}


def test_every_field_a_resume_reads_is_checksummed_and_an_edited_one_refused(run):
    path = run / "checkpoints" / "step-0000004"
    info = json.loads((path / "trainer.json").read_text())
    assert set(info["sha256"]) == {"model.safetensors", "optimizer.pt"} and len(info[STATE_KEY]) == 64
    read_checkpoint(path)  # as written: verified
    for edit in ({"step": 3}, {"stopped": True}, {"train": {**info["train"], "lr": 0.5}},
                 {"sha256": {**info["sha256"], "optimizer.pt": "0" * 64}}):
        (path / "trainer.json").write_text(json.dumps({**info, **edit}))
        with pytest.raises(CheckpointCorrupt, match="trainer.json does not match its checksum"):
            read_checkpoint(path)
    messages = []
    trainer = Trainer(mlm_objective(), toy_data(), quick(steps=4), run, log=messages.append)
    assert trainer.resume() and trainer.step == 2  # the edited step-4 checkpoint is skipped
    assert messages[0].startswith("warning:") and "step-0000004" in messages[0]


def test_a_checkpoint_without_checksums_loads_with_one_line_saying_it_is_unverified(run):
    path = run / "checkpoints" / "step-0000004"
    info = json.loads((path / "trainer.json").read_text())
    old = {k: v for k, v in info.items() if k not in ("sha256", STATE_KEY)}  # as written before checksums
    (path / "trainer.json").write_text(json.dumps(old))
    said = []
    read_checkpoint(path, warn=said.append)
    assert len(said) == 1 and "\n" not in said[0] and "unverified" in said[0]
    assert "model.safetensors, optimizer.pt, trainer.json" in said[0]
    (path / "trainer.json").write_text(json.dumps({**old, STATE_KEY: info[STATE_KEY]}))  # some, not all
    with pytest.raises(CheckpointCorrupt):
        read_checkpoint(path)
    # the files' checksums without the state's: as written before the state's was (trainer.json unverified)
    (path / "trainer.json").write_text(json.dumps({**old, "sha256": info["sha256"]}))
    said.clear()
    read_checkpoint(path, warn=said.append)
    assert len(said) == 1 and "without checksums for trainer.json: loading it unverified" in said[0]
    # one file's checksum dropped: never written so by any version, so edited; refused naming the file
    one = {"model.safetensors": info["sha256"]["model.safetensors"]}
    (path / "trainer.json").write_text(json.dumps({**old, "sha256": one}))
    with pytest.raises(CheckpointCorrupt, match="trainer.json lacks the checksum of optimizer.pt$"):
        read_checkpoint(path)
    # unverified, so nothing but the load tells an optimizer.pt of another kind: one line naming it
    (path / "trainer.json").write_text(json.dumps(old))
    torch.save({"state": {}}, path / "optimizer.pt")
    with pytest.raises(CheckpointCorrupt, match="step-0000004: optimizer.pt holds no optimizer state$"):
        read_checkpoint(path)


def test_resume_with_nothing_to_resume_is_refused_in_one_line(tmp_path, capsys):
    root = tmp_path / "x" / "checkpoints"
    with pytest.raises(NothingToResume, match=f"^resume=True \\(--resume\\): no checkpoint under {root}"):
        Trainer(mlm_objective(), toy_data(), quick(steps=1), tmp_path / "x").fit(resume=True)
    assert not (tmp_path / "x" / "metrics.jsonl").exists()
    argv = ["pretrain", "--preset", "bert-base", "--objective", "mlm", "--out", str(tmp_path / "y"),
            "--steps", "1", "--resume"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(--resume): no checkpoint under" in err and "Traceback" not in err
    assert not (tmp_path / "y").exists()  # refused before any work


def test_an_output_that_is_an_input_is_refused_naming_both_and_the_input_kept(tmp_path, capsys):
    data = tmp_path / "x.csv"
    data.write_text("text,label\nhello,1\n")
    assert main(["evaluate", "--model", str(tmp_path / "m"), "--data", str(data), "--out", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {data}" in err and f"--data {data}" in err
    assert data.read_text() == "text,label\nhello,1\n"
    (tmp_path / "metrics.jsonl").write_text("{}")
    with pytest.raises(UnsafePath, match="--out .* holds the input --train .*metrics.jsonl"):
        refuse_overwrite(tmp_path, ("--train", tmp_path / "metrics.jsonl"), writes=("metrics.jsonl",))
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "train.jsonl").write_text("{}")
    with pytest.raises(UnsafePath, match="--train"):  # inside a folder the job replaces
        refuse_overwrite(tmp_path, ("--train", str(tmp_path / "final" / "train.jsonl")), writes=("final",))
    (tmp_path / "link.csv").symlink_to(data)
    with pytest.raises(UnsafePath, match="--data"):  # through a link
        refuse_overwrite(tmp_path / "link.csv", ("--data", [str(data)]))
    refuse_overwrite(tmp_path / "other.csv", ("--data", str(data)), ("--model", "bert-base"),
                     ("--valid", None))  # another file, a preset name, an option not given: nothing refused


def test_a_link_named_final_is_replaced_by_the_whole_folder_and_its_target_kept(tmp_path):
    """final/ is staged and put in place whole: a link there is replaced, not written through, and the
    job's own files (final_files) are in it from the first moment it exists."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("the user's")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "final").symlink_to(elsewhere, target_is_directory=True)
    Trainer(mlm_objective(), toy_data(), quick(steps=1), tmp_path / "out").fit(
        final_files=(lambda folder: (folder / "extra.txt").write_text("written with the model"),))
    final = tmp_path / "out" / "final"
    assert not final.is_symlink() and {p.name for p in final.iterdir()} == {
        "config.json", "model.safetensors", "extra.txt"}
    assert [p.name for p in elsewhere.iterdir()] == ["notes.txt"]


def test_a_link_named_as_a_checkpoint_is_skipped_and_replaced_when_its_step_is_saved_its_target_kept(run):
    import shutil

    step = run / "checkpoints" / "step-0000004"
    shutil.rmtree(step)
    elsewhere = run / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("the user's")
    step.symlink_to(elsewhere, target_is_directory=True)
    said = []
    Trainer(mlm_objective(), toy_data(), quick(steps=4, save_every=2), run, log=said.append).fit(resume=True)
    assert said[0].startswith("warning: checkpoint ") and "step-0000004" in said[0]  # no checkpoint: skipped
    assert not step.is_symlink() and (step / "trainer.json").is_file()  # step 4 saved again, in its place
    assert [p.name for p in elsewhere.iterdir()] == ["notes.txt"]


def test_a_final_folder_that_fails_to_be_written_leaves_the_one_before_and_no_part(tmp_path):
    out = tmp_path / "out"
    Trainer(mlm_objective(), toy_data(), quick(steps=1, save_every=1), out).fit()
    (out / "final" / "marker").write_text("the folder before")  # a new final/ would not have it
    before = {p.name: p.read_bytes() for p in (out / "final").iterdir()}

    def fails(folder):
        raise OSError("the disk went away")

    with pytest.raises(OSError, match="the disk went away"):
        Trainer(mlm_objective(), toy_data(), quick(steps=1, save_every=1), out).fit(
            resume=True, final_files=(fails,))
    assert {p.name: p.read_bytes() for p in (out / "final").iterdir()} == before
    assert not [p for p in out.iterdir() if p.name.startswith(".final")]  # no staged part left


@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_at_checkpoints_is_refused_naming_it_before_any_step_and_its_target_kept(tmp_path, dangling):
    elsewhere = tmp_path / "elsewhere"
    if not dangling:
        elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "checkpoints").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UnsafePath, match=r"out/checkpoints: is a symbolic link") as err:
        Trainer(mlm_objective(), toy_data(), quick(steps=2, save_every=1), tmp_path / "out").fit()
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoints"]  # nothing trained, written
    assert (list(elsewhere.iterdir()) == []) if not dangling else not elsewhere.exists()


def test_save_checkpoint_refuses_a_link_as_its_folder(tmp_path):
    from lmforge.train.checkpoint import save_checkpoint

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "checkpoints").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(UnsafePath, match="checkpoints: is a symbolic link"):
        save_checkpoint(tmp_path / "checkpoints", 1, {"w": torch.ones(2)}, {}, {}, keep_last=1)
    assert list((tmp_path / "elsewhere").iterdir()) == []
