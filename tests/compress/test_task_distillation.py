"""Task-specific distillation: the loss on a hand example, the student's initialisation from the
teacher's layers, `lmforge distill` end to end on tiny models, and its refusals."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

import lmforge
from lmforge.cli import main
from lmforge.compress.task_distillation import DistillConfig, TaskDistillation, make_student, student_layers
from lmforge.config.options import OptionsError
from lmforge.objectives.distilbert import soft_cross_entropy
from lmforge.tasks.finetune import TaskConfig, encode_split, fine_tuned_task, make_task, save_model
from tests.tasks.core import saved_classifier, sentiment, tiny, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: no waiting on a busy second core


def test_soft_cross_entropy_on_a_hand_example():
    student, teacher, T = torch.tensor([[1.0, 2.0, 0.0]]), torch.tensor([[0.0, 1.0, 3.0]]), 2.0
    p = [math.exp(z / T) for z in (0.0, 1.0, 3.0)]
    p = [x / sum(p) for x in p]
    log_q = [z / T for z in (1.0, 2.0, 0.0)]
    log_q = [x - math.log(sum(math.exp(v) for v in log_q)) for x in log_q]
    # T^2 KL(p || q): the soft cross-entropy -sum p log q less the teacher's entropy, a constant
    kl = sum(pi * (math.log(pi) - qi) for pi, qi in zip(p, log_q))
    assert float(soft_cross_entropy(student, teacher, T)) == pytest.approx(T * T * kl, rel=1e-6)
    assert float(soft_cross_entropy(teacher, teacher, T)) == pytest.approx(0.0, abs=1e-7)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A tiny 4-layer BERT with a sentiment head, saved as a fine-tuned directory (task.json)."""
    root = tmp_path_factory.mktemp("distill")
    data = sentiment(200)
    task = make_task("cls", tiny("bert-base", n_layers=4, n_heads=4), tokenizer(), data["train"],
                     TaskConfig(max_len=32))
    save_model(task, root / "teacher")
    for split in ("train", "validation"):
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data[split][:48]))
    return root


def test_student_copies_every_other_layer_or_the_first_n(teacher_dir):
    teacher = fine_tuned_task(teacher_dir / "teacher", sentiment(200)["train"])
    assert student_layers("every-other", 6) == (0, 2, 4) and student_layers("2", 6) == (0, 1)
    assert student_layers("every-other", 5) == (0, 2)  # half, rounded down, as docs/distill.md says
    source = {k: v.cpu() for k, v in teacher.model.state_dict().items()}  # a teacher on a GPU too
    for spec, layers in (("every-other", (0, 2)), (3, (0, 1, 2))):
        student = make_student(teacher, spec)
        assert student.config.n_layers == len(layers)
        state = student.state_dict()
        for k, t in enumerate(layers):
            for key in (k for k in state if k.startswith(f"encoder.blocks.{k}.")):
                theirs = key.replace(f"encoder.blocks.{k}.", f"encoder.blocks.{t}.", 1)
                assert torch.equal(state[key], source[theirs])
        head = [k for k in state if k.startswith("heads.")]
        assert head and all(torch.equal(state[k], source[k]) for k in head)  # the task head too
    for n in (5, 0):  # the option named, and what it takes
        with pytest.raises(OptionsError, match=f"^student_layers={n}: expected every-other or a number of "
                                               "layers from 1 to 4 .the teacher has 4 layers.$") as err:
            student_layers(n, 4)
        assert err.value.field == "student_layers"
    for spec in (None, "every-other"):  # a 1-layer teacher: the empty choice had been refused unnamed
        with pytest.raises(ValueError, match="every other teacher layer needs a teacher of 2 layers or more"):
            student_layers(spec, 1)
    assert student_layers(1, 1) == (0,)


def test_distillation_loss_mixes_soft_and_hard_labels(teacher_dir):
    records = sentiment(200)["train"][:8]
    teacher = fine_tuned_task(teacher_dir / "teacher", records)
    student = make_task("cls", make_student(teacher, 2), teacher.tokenizer, records, TaskConfig(max_len=32),
                        teacher.labels).to(teacher.device)  # beside the teacher, on a GPU too
    objective = TaskDistillation(student, teacher,
                                 DistillConfig(temperature=3.0, alpha=0.25, gamma=0.5)).eval()
    batch = student.collate(encode_split(student, records, "data"))
    batch = {k: v.to(teacher.device) for k, v in batch.items()}
    with torch.no_grad():
        out = objective(batch)
        s, t = student.scores(batch), teacher.scores(batch)
        real = batch["attention_mask"].bool()
        hs = student.model(batch["input_ids"], batch["attention_mask"],
                           run_heads=False).last_hidden_state[real]
        ht = teacher.model(batch["input_ids"], batch["attention_mask"],
                           run_heads=False).last_hidden_state[real]
    soft = 9.0 * F.kl_div(F.log_softmax(s / 3, -1), F.softmax(t / 3, -1), reduction="batchmean")
    hard = F.cross_entropy(s, batch["label"])
    cos = (1 - F.cosine_similarity(hs, ht, dim=-1)).mean()
    torch.testing.assert_close(out.loss, 0.25 * soft + 0.75 * hard + 0.5 * cos)
    assert not any(p.requires_grad for p in teacher.model.parameters())


def test_distill_command_end_to_end(teacher_dir, tmp_path, capsys):
    out = tmp_path / "student"
    argv = ["distill", "--teacher", str(teacher_dir / "teacher"), "--train", str(teacher_dir / "train.jsonl"),
            "--valid", str(teacher_dir / "validation.jsonl"), "--out", str(out), "--steps", "4",
            "progress=false", "batch_size=8", "lr=1e-3", "temperature=2", "gamma=1", "eval_every=4"]
    assert main(argv) == 0
    report = json.loads((out / "distill.json").read_text())
    assert report["layers"] == {"teacher": 4, "student": 2} and report["seed"] == 0  # the run's, said
    assert report["loss"] == {"temperature": 2, "alpha": 0.5, "gamma": 1}  # the loss's options only
    assert report["student"]["parameters"] < report["teacher"]["parameters"]
    assert report["student"]["bytes"] < report["teacher"]["bytes"]
    assert {"metric", "seconds_b16"} <= set(report["student"]) and report["speedup"] > 0
    assert (out / "metrics.jsonl").is_file() and (out / "final" / "task.json").is_file()
    assert lmforge.load(out / "final").config.n_layers == 2
    assert "student keeps" in capsys.readouterr().out
    # resume: the run is complete, so it continues from its checkpoint and trains no further
    assert main(argv + ["--resume"]) == 0
    # a preset student: random init, fresh head, the teacher's vocabulary
    assert main(argv[:7] + ["--data", str(teacher_dir / "validation.jsonl"),
                            "--out", str(tmp_path / "preset"), "--steps", "2", "--student", "bert-tiny",
                            "progress=false", "batch_size=8"]) == 0
    report = json.loads((tmp_path / "preset" / "distill.json").read_text())
    assert report["layers"]["student"] == 2 and \
        lmforge.load(tmp_path / "preset" / "final").config.d_model == 128


def test_distill_command_refuses_bad_input(teacher_dir, tmp_path, capsys):
    base = ["distill", "--teacher", str(teacher_dir / "teacher"), "--train", str(teacher_dir / "train.jsonl"),
            "--valid", str(teacher_dir / "validation.jsonl"), "--out", str(tmp_path / "x"), "--steps", "1"]
    # the flag named once, as 0's is (it said "student_layers 9: ..."); a preset mistyped gets its closest
    for extra, named in ((["--student-layers", "9"], "error: --student-layers 9: expected every-other or a "
                                                     "number of layers from 1 to 4"),
                         (["--student", "bert-tinyy"], "--student bert-tinyy: is not a preset; did you mean "
                                                       "bert-tiny"),
                         (["--student-layers", "0"], "--student-layers 0: expected every-other"),
                         (["--student-layers", "x"], "every-other"),
                         (["--student", "no-such-preset"], "not a preset"), (["alpha=2"], "alpha"),
                         (["bogus=1"], "bogus"),
                         (["--student", "bert-tiny", "gamma=1"], "d_model"),
                         (["--student", "bert-base", "--student-layers", "2"], "not both")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and named in err[0], (extra, err)
    assert main(["distill", "--teacher", str(tmp_path), "--train", str(teacher_dir / "train.jsonl"),
                 "--valid", str(teacher_dir / "validation.jsonl"), "--out", str(tmp_path / "y")]) == 2
    assert "task.json" in capsys.readouterr().err  # a teacher that is no fine-tuned model


def _refused(argv, capsys) -> str:
    """The one error line of a refused command (exit 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_an_int8_teacher_is_refused_in_one_line_before_any_training(teacher_dir, tmp_path, capsys):
    from lmforge.compress.quantize import quantize

    teacher = fine_tuned_task(teacher_dir / "teacher", sentiment(200)["train"], device="cpu")
    quantize(teacher.model, inplace=True)
    save_model(teacher, tmp_path / "int8")
    base = ["distill", "--teacher", str(tmp_path / "int8"), "--train", str(teacher_dir / "train.jsonl"),
            "--valid", str(teacher_dir / "validation.jsonl"), "--out", str(tmp_path / "x"), "--steps", "1"]
    for student in ([], ["--student", "bert-tiny"]):  # copied layers, or a preset taught by the teacher
        line = _refused(base + student, capsys)
        assert "--teacher" in line and "int8-quantised" in line and "fp32 model" in line, line
    assert not (tmp_path / "x" / "metrics.jsonl").exists()


def test_loss_options_that_are_not_finite_are_refused_by_name(teacher_dir, tmp_path, capsys):
    base = ["distill", "--teacher", str(teacher_dir / "teacher"), "--train", str(teacher_dir / "train.jsonl"),
            "--valid", str(teacher_dir / "validation.jsonl"), "--out", str(tmp_path / "x"), "--steps", "1"]
    options = ("temperature=nan", "temperature=inf", "gamma=nan", "gamma=inf", "alpha=nan", "temperature=-1",
               "temperature=1e-45", "temperature=0.001")  # 1e-45 was taken, and its loss was NaN
    for option in options:
        name = option.partition("=")[0]
        assert _refused(base + [option], capsys).startswith(f"lmforge distill: error: {name} must be"), option
        with pytest.raises(ValueError, match=name):
            DistillConfig.from_dict({name: float(option.partition("=")[2])})
    with pytest.raises(SystemExit) as refused:  # the flag's own bounds, at parsing (tests/cli/test_common.py)
        main(base[:-1] + ["0"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "--steps 0: must be in [1, 10000000]" in err
    assert not (tmp_path / "x").exists()


def test_data_labels_and_out_are_checked_before_training(teacher_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "a good film", "label": "banana"}) + "\n")
    base = ["distill", "--teacher", str(teacher_dir / "teacher"), "--train", str(teacher_dir / "train.jsonl"),
            "--steps", "1", "progress=false"]
    line = _refused(base + ["--data", str(bad), "--out", str(tmp_path / "x")], capsys)
    # the file named (records remember where they came from)
    assert str(bad) in line and "banana" in line, line
    assert not (tmp_path / "x" / "metrics.jsonl").exists() and not (tmp_path / "x" / "final").exists()
    teacher = {f.name: f.read_bytes() for f in (teacher_dir / "teacher").iterdir()}
    valid = ["--valid", str(teacher_dir / "validation.jsonl")]
    for out in (str(teacher_dir / "teacher"), str(teacher_dir), ""):  # over the teacher, or nowhere
        assert "--out" in _refused(base + valid + ["--out", out], capsys)
    assert {f.name: f.read_bytes() for f in (teacher_dir / "teacher").iterdir()} == teacher


def test_python_records_are_read_as_a_file_s_and_a_bad_label_names_its_argument(teacher_dir, tmp_path):
    """distill took Python's records unread: class ids 0 and 1 were refused as labels the teacher lacks ("0",
    "1"); they train as a file's do, and a label it lacks names its argument: train, validation or data."""
    from lmforge.compress.task_distillation import distill, run_distill
    from lmforge.train import TrainConfig
    cfg = TrainConfig(steps=1, batch_size=2, log_every=100, progress=False)
    teacher, ids = teacher_dir / "teacher", [{"text": "good", "label": 1}, {"text": "bad", "label": 0}]
    distill(teacher, ids, ids, tmp_path / "ids", train_cfg=cfg)
    bad = [{"text": "a film", "label": "7"}]
    for field, job, records in (("train", distill, (bad, None)), ("validation", distill, (ids, bad)),
                                ("data", run_distill, (ids, None, bad))):
        with pytest.raises(OptionsError, match=f"^{field}: line 1: label '7' is not one of the") as err:
            job(teacher, *records, tmp_path / field, train_cfg=cfg)
        assert err.value.field == field and not (tmp_path / field / "final").exists()


def test_a_student_of_the_teacher_s_size_claims_no_speed_up(capsys):
    from lmforge.cli.distill import _print

    row = {"parameters": 100, "bytes": 400, "metric": 0.9, "metric_name": "accuracy", "seconds_b16": 0.01}
    report = {"layers": {"teacher": 4, "student": 4}, "teacher": row, "student": row, "metric_kept": 1.0,
              "speedup": 1.07, "parameters_ratio": 1.0, "student_dir": "out/best"}
    _print(report, "out")
    line = capsys.readouterr().out.splitlines()[-1]
    assert "the teacher's size (times 1.07x apart: noise)" in line and "faster" not in line
    assert "student in out/best" in line  # where the student to use is


def test_a_slower_student_is_called_slower():
    from lmforge.cli.distill import speed

    assert speed(1.5) == "1.50x faster" and speed(1.0) == "1.00x faster"
    assert speed(0.69) == "1.45x slower"  # the teacher's time over the student's below 1


def test_a_student_of_a_structurally_pruned_teacher_starts_as_its_kept_layers(teacher_dir, tmp_path):
    from lmforge.compress.head_pruning import prune_heads
    from lmforge.compress.ffn import ffn_importance, prune_ffn

    records = sentiment(200)["train"][:16]
    teacher = fine_tuned_task(teacher_dir / "teacher", records, device="cpu")
    prune_ffn(teacher.model, ffn_importance(teacher, encode_split(teacher, records, "data")), 0.5)
    prune_heads(teacher.model, {"encoder.2": [0, 3], "encoder.3": [1]})
    save_model(teacher, tmp_path / "pruned")
    loaded = fine_tuned_task(tmp_path / "pruned", records, device="cpu")  # as distill reads it
    student, source = make_student(loaded), teacher.model.state_dict()  # teacher layers 0 and 2
    assert student.config.pruned_heads == {"encoder.1": [0, 3]}
    assert student.config.ffn_sizes == {"encoder.0": 32, "encoder.1": 32}
    for key, value in student.state_dict().items():
        assert torch.equal(value, source[key.replace("encoder.blocks.1.", "encoder.blocks.2.", 1)]), key
    argv = ["distill", "--teacher", str(tmp_path / "pruned"), "--train", str(teacher_dir / "train.jsonl"),
            "--data", str(teacher_dir / "validation.jsonl"), "--out", str(tmp_path / "d"), "--steps", "1",
            "progress=false", "batch_size=4"]
    assert main(argv) == 0
    assert lmforge.load(tmp_path / "d" / "final").config.pruned_heads == {"encoder.1": [0, 3]}


def test_the_student_is_chosen_in_the_options_python_and_the_command_line_refuse_alike(teacher_dir, tmp_path,
                                                                                      capsys):
    from lmforge.config.options import OptionsError

    for fields, flags, words in (({"student": "bert-base", "student_layers": "2"},
                                  ["--student", "bert-base", "--student-layers", "2"], "not both"),
                                 ({"student": "no-such-preset"}, ["--student", "no-such-preset"],
                                  "--student no-such-preset: is not a preset")):
        with pytest.raises(OptionsError) as refused:
            DistillConfig(**fields)
        assert refused.value.field == "student"
        argv = ["distill", "--teacher", str(teacher_dir / "teacher"),
                "--train", str(teacher_dir / "train.jsonl"), "--valid", str(teacher_dir / "validation.jsonl"),
                "--out", str(tmp_path / "x"), *flags]
        assert words in _refused(argv, capsys)
    assert not (tmp_path / "x").exists()


def test_a_mistyped_student_is_offered_transformer_presets_only_and_an_elmo_one_is_said_why():
    """The hint was get_config's, which offered ELMo's presets ("elmo-smal": did you mean elmo-small?), each
    then refused as "not a preset" with no reason."""
    from lmforge.presets import ELMO_PRESETS, PRESETS

    with pytest.raises(OptionsError, match=r"^student='elmo-smal' is not a preset; did you mean ") as err:
        DistillConfig(student="elmo-smal")
    offered = str(err.value).partition("did you mean ")[2].rstrip("?").split(", ")
    assert offered and all(name in PRESETS for name in offered) and err.value.field == "student"
    with pytest.raises(OptionsError, match=r"^student='elmo-small' is not a preset a student can be \(ELMo's "
                                           r"is a biLSTM") as err:
        DistillConfig(student="elmo-small")
    with pytest.raises(OptionsError, match=r"is not a preset; presets: bert-tiny, ") as err:
        DistillConfig(student="zzzqqq")
    assert not any(name in str(err.value) for name in ELMO_PRESETS)


@pytest.mark.parametrize("layers", ["every-others", 0, -3, 2.7, True, "1025"])
def test_a_bad_student_layers_is_refused_when_the_options_are_built(layers):
    with pytest.raises(OptionsError) as err:
        DistillConfig(student_layers=layers)
    assert err.value.field == "student_layers"


@pytest.mark.parametrize("layers", ["abc", "every-others", 2.7, True, [2], "²", "9" * 5000])
def test_student_layers_outside_distill_config_refuses_as_distill_config_does(layers):
    """An unparsable student_layers given to student_layers itself (not through DistillConfig) was int()'s
    plain ValueError: it is the config's OptionsError, naming the field, from the one check both read."""
    with pytest.raises(OptionsError, match="^student_layers") as config:
        DistillConfig(student_layers=layers)  # a float, a bool or a list: refused by type, before
    with pytest.raises(OptionsError, match="^student_layers: expected every-other or a number of layers "
                                           "from 1 to 4 .the teacher has 4 layers., got '") as err:
        student_layers(layers, 4)
    assert err.value.field == config.value.field == "student_layers"


@pytest.mark.parametrize("preset", ["bert-tinyy", "elmo-small", "zzzqqq"])
def test_a_student_preset_outside_distill_config_refuses_as_distill_config_does(preset):
    """make_student's own check was a plain ValueError ("--student 'x' is not a preset", a flag Python has
    not, and no closest preset): it is DistillConfig's OptionsError naming student, from the one check."""
    with pytest.raises(OptionsError) as config:
        DistillConfig(student=preset)
    with pytest.raises(OptionsError) as err:
        make_student(None, preset=preset)  # refused before the teacher is read
    assert str(err.value) == str(config.value) and err.value.field == "student"
    assert str(err.value).startswith(f"student={preset!r} is not a preset")
    with pytest.raises(OptionsError, match=r"^student=\['bert-tiny'\] is not a preset") as err:
        make_student(None, preset=["bert-tiny"])  # no string: no preset (not `in`'s TypeError)
    assert err.value.field == "student"


def test_a_temperature_the_loss_leaves_out_is_refused(teacher_dir, tmp_path, capsys):
    with pytest.raises(OptionsError, match="^temperature=5: softens the teacher's targets") as err:
        DistillConfig(alpha=0, temperature=5)  # alpha=0: the soft targets, and their temperature, unread
    assert err.value.field == "temperature"
    assert DistillConfig(alpha=0).temperature == DistillConfig(alpha=0.5, temperature=5).temperature - 3
    argv = ["distill", "--teacher", str(teacher_dir / "teacher"), "--train", str(teacher_dir / "train.jsonl"),
            "--valid", str(teacher_dir / "validation.jsonl"), "--out", str(tmp_path / "x"), "alpha=0",
            "temperature=5"]
    assert "temperature=5: softens the teacher's targets" in _refused(argv, capsys)
    assert not (tmp_path / "x").exists()


def test_a_validation_setting_without_validation_records_is_refused_in_both_faces(teacher_dir, tmp_path,
                                                                                  capsys):
    from lmforge.compress.task_distillation import distill
    from lmforge.train import TrainConfig

    with pytest.raises(OptionsError, match="^eval_every=5: a setting of validation") as err:
        distill(teacher_dir / "teacher", [], None, tmp_path / "p", train_cfg=TrainConfig(eval_every=5))
    assert err.value.field == "eval_every" and not (tmp_path / "p").exists()
    argv = ["distill", "--teacher", str(teacher_dir / "teacher"), "--train", str(teacher_dir / "train.jsonl"),
            "--data", str(teacher_dir / "validation.jsonl"), "--out", str(tmp_path / "x"), "eval_every=5"]
    assert "eval_every=5: a setting of validation" in _refused(argv, capsys)  # no --valid: nothing reads it
    assert not (tmp_path / "x").exists()


def test_a_resume_with_another_teacher_of_the_same_shape_is_refused_by_name(teacher_dir, tmp_path, capsys):
    """The checkpoints carry the run's teacher: a resume with another one went on with the run's, unsaid."""
    data = sentiment(200)
    other = make_task("cls", tiny("bert-base", n_layers=4, n_heads=4), tokenizer(), data["train"],
                      TaskConfig(max_len=32))
    with torch.no_grad():  # the same shape, other weights
        other.model.encoder.blocks[0].attn.out.weight.add_(0.01)
    save_model(other, tmp_path / "other")
    argv = ["distill", "--train", str(teacher_dir / "train.jsonl"), "--out", str(tmp_path / "run"),
            "--valid", str(teacher_dir / "validation.jsonl"),
            "--steps", "2", "progress=false", "batch_size=8"]
    assert main(["distill", "--teacher", str(teacher_dir / "teacher"), *argv[1:]]) == 0
    capsys.readouterr()
    assert main(["distill", "--teacher", str(tmp_path / "other"), *argv[1:], "--resume"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "teacher=" in error and "(the run's)" in error


@pytest.mark.parametrize("preset", ["bart-base", "gpt2"])
def test_a_teacher_that_is_no_encoder_is_refused_naming_teacher_before_any_work(preset, tmp_path, capsys):
    """An encoder-decoder teacher was refused as 'student_from_teacher takes an encoder or decoder'."""
    records = sentiment(200)["train"][:16]
    saved_classifier(tmp_path / "t", preset, "bert" if preset == "bart-base" else "gpt2", records, 32)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    err = _refused(["distill", "--teacher", str(tmp_path / "t"), "--train", str(tmp_path / "d.jsonl"),
                    "--data", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "o"), "--steps", "1"],
                   capsys)
    architecture = lmforge.load(tmp_path / "t").config.architecture
    assert err.startswith(f"lmforge distill: error: --teacher {tmp_path / 't'}: {architecture} fine-tuned "
                          "for cls; the teacher must be an encoder")
    assert not (tmp_path / "o").exists()


def test_the_python_face_refuses_an_out_that_is_or_holds_the_teacher_before_any_work(tmp_path):
    """distill("runs/x/final", out="runs/x") replaced the teacher with its own final/ (the command's
    --out refused it); run_distill wrote into the teacher's folder alike."""
    from lmforge.compress.task_distillation import distill, run_distill
    from lmforge.train import TrainConfig
    from lmforge.utils.atomic import UnsafePath

    teacher = tmp_path / "runs" / "x" / "final"
    teacher.mkdir(parents=True)
    (teacher / "config.json").write_text("{}")
    for out in (teacher, teacher.parent, tmp_path):
        for job in (lambda: distill(teacher, [], None, out, train_cfg=TrainConfig(steps=1)),
                    lambda: run_distill(teacher, [], None, [], out, train_cfg=TrainConfig(steps=1))):
            with pytest.raises(UnsafePath, match=f"^out {out} (is|holds) the input teacher_dir ") as err:
                job()
            assert err.value.field == "out"
    assert [p.name for p in tmp_path.rglob("*")] == ["runs", "x", "final", "config.json"]
