"""utils.apart: the one refusal of an output over an input, naming the output (as the caller calls it) and
the input, for inputs given as a path, a list, a loaded model or nothing on disk."""
import pytest

from lmforge.utils.apart import WHY, WHY_MODEL, refuse_writing_over
from lmforge.utils.atomic import UnsafePath


@pytest.fixture
def model(tmp_path):
    """A model folder (its config.json) inside a run folder."""
    path = tmp_path / "run" / "final"
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_the_output_is_named_as_the_caller_names_it_and_the_input_as_given(model):
    for name in ("out", "--out", "--teacher-out"):
        with pytest.raises(UnsafePath) as err:
            refuse_writing_over(model, ("model", str(model)), name=name)
        said = f"{name} {model} is the input model {model}: {WHY['is']}; choose another {name}"
        assert str(err.value) == said
        assert err.value.field == name


def test_a_model_folder_is_read_by_its_model_files_and_any_other_folder_whole(model):
    refuse_writing_over(model / "preds.jsonl", ("model", str(model)), models=("model",))  # a report beside
    for given in (model / "config.json", model / "vocab.txt"):  # a file its loader reads, there yet or not
        with pytest.raises(UnsafePath, match=f"^out {given} lies inside the input model {model}: "):
            refuse_writing_over(given, ("model", str(model)), models=("model",))
    with pytest.raises(UnsafePath, match=f"^out {model / 'preds.jsonl'} lies inside the input data "):
        refuse_writing_over(model / "preds.jsonl", ("data", str(model)))  # not a model: every file is read


def test_lying_inside_says_a_model_file_is_written_over_or_a_read_folder_would_read_the_output_back(model):
    """A model folder is read by its model files: the output would be one of them. Any other folder is read
    whole: the output is not written over an input file, but would be read back as one."""
    with pytest.raises(UnsafePath) as err:
        refuse_writing_over(model / "config.json", ("model", str(model)), models=("model",))
    assert str(err.value).endswith(f"model {model}: {WHY_MODEL}; choose another out")
    with pytest.raises(UnsafePath) as err:
        refuse_writing_over(model / "preds.jsonl", ("data", str(model)))
    assert str(err.value).endswith(f"data {model}: {WHY['lies inside']}; choose another out")
    assert "every file of that folder is read" in str(err.value) and "write over" not in str(err.value)


def test_holds_refuses_an_output_folder_that_holds_the_input_at_all(model):
    run = model.parent
    refuse_writing_over(run, ("model", str(model)), writes=("report.json",), models=("model",))
    for holds in (("model",), True):
        with pytest.raises(UnsafePath, match=f"^out {run} holds the input model {model}: "):
            refuse_writing_over(run, ("model", str(model)), writes=("report.json",), holds=holds)
    with pytest.raises(UnsafePath, match=f"^out {run} holds the input model {model}: "):  # a written name
        refuse_writing_over(run, ("model", str(model)), writes=("final",))


def test_every_kind_of_input_is_read_for_the_paths_it_names_on_disk(model, tmp_path):
    class Loaded:
        loaded_from = model

    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    for given, shown in (([str(tmp_path / "other.jsonl"), str(data)], data), (Loaded(), model)):
        with pytest.raises(UnsafePath, match=f"^out {shown} is the input x {shown}: "):
            refuse_writing_over(shown, ("x", given))
    for given in (None, "", "bert-base", str(tmp_path / "missing"), object(), 3):  # nothing on disk
        refuse_writing_over(tmp_path / "missing", ("x", given), holds=True)
    refuse_writing_over(None, ("x", str(data)))  # no output asked for
