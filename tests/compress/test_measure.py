"""What a compression report measures: the size on disk of the weight files a model is loaded from."""
import torch
from safetensors.torch import load_file

from lmforge.compress.measure import model_bytes
from tests.tasks.core import tiny


def test_size_on_disk_is_the_weight_files_the_model_loads_from(tmp_path):
    """A Hugging Face directory of pytorch_model.bin was 0 bytes ("0.0 MB" before pruning, and distill
    divided by it after training)."""
    tiny("bert-base", n_layers=1).save(tmp_path / "m")
    safetensors = (tmp_path / "m" / "model.safetensors").stat().st_size
    assert model_bytes(tmp_path / "m") == safetensors
    torch.save(load_file(tmp_path / "m" / "model.safetensors"), tmp_path / "m" / "pytorch_model.bin")
    assert model_bytes(tmp_path / "m") == safetensors  # beside safetensors a .bin is never read
    (tmp_path / "m" / "model.safetensors").unlink()
    pickled = (tmp_path / "m" / "pytorch_model.bin").stat().st_size
    assert pickled > 0 and model_bytes(tmp_path / "m") == pickled


def test_the_batch_timed_is_the_one_reported(tmp_path):
    """Five records were timed as a batch of 5 under a column saying batch 16."""
    from lmforge.compress.measure import forward_title, measure_side_by_side
    from lmforge.tasks.finetune import TaskConfig, make_task
    from tests.tasks.core import sentiment, tokenizer

    records = sentiment(40)["train"]
    task = make_task("cls", tiny("bert-base", n_layers=1), tokenizer(), records, TaskConfig(max_len=16))
    task.model.save(tmp_path / "m")
    for n, timed in ((5, 5), (20, 16)):
        out = measure_side_by_side({"a": task}, records[:n], {"a": tmp_path / "m"}, rounds=1)
        assert out["a"]["timed_batch"] == timed
        assert forward_title([out["a"]]) == f"forward s (batch {timed})"


def test_given_data_names_a_python_record_by_its_argument_and_keeps_the_records_own_lines():
    """A Python record is named by the argument it came in, as fine-tuning's train:n (its number from 1
    where it says no line of its own), in a generator too; records that pass keep their lines."""
    import pytest

    from lmforge.compress.measure import given_data
    from lmforge.config.options import OptionsError
    from tests.tasks.core import sentiment

    data = sentiment(40)["train"][:3]
    for name in ("records", "importance_records"):
        with pytest.raises(OptionsError, match=rf"^{name}:4: a record is a dict of fields") as err:
            given_data((row for row in [*data, "good"]), "cls", name)
        assert err.value.field == name
    assert [row["line"] for row in given_data(data, "cls")] == [row["line"] for row in data]
