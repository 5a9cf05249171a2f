"""run_quantize, the Python face of `lmforge quantize`: calibration texts and options it cannot take are an
OptionsError naming the field before any work, and the texts' cost is bounded as the command's is."""
from __future__ import annotations

import pytest

from lmforge.compress.quantize_report import calibration_texts, quantised_bits, run_quantize
from lmforge.compress.smooth import CALIBRATION_TEXTS
from lmforge.config.options import OptionsError


@pytest.mark.parametrize("given, words", [
    ("a text", "must be a list of texts, got str"), ([], "is empty"), (["fine", 3], r"calibration\[1\]"),
    (["fine", "  "], r"calibration\[1\]"), ({"a": 1}, "got dict"),
])
def test_calibration_that_is_no_list_of_texts_is_refused_naming_it(tmp_path, given, words):
    """A str was read character by character, [] calibrated on random tokens unsaid, an int was a
    TypeError, a blank text was smoothed on."""
    with pytest.raises(OptionsError, match=words) as err:
        run_quantize(tmp_path / "no-model", tmp_path / "out", calibration=given)
    assert err.value.field == "calibration" and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_calibration_keeps_its_first_texts_stripped_as_the_command_reads_a_file():
    """A list of 100,000 texts was all tokenised and run (unbounded); --calibration keeps 512 lines."""
    given = [" first "] + [f"text {n}" for n in range(CALIBRATION_TEXTS * 3)]
    texts = calibration_texts(given)
    assert texts == ["first", *given[1:CALIBRATION_TEXTS]]
    assert calibration_texts(None) is None


def test_options_that_are_no_quantize_options_are_refused_naming_them(tmp_path):
    """options={"mode": ...} was an AttributeError."""
    with pytest.raises(OptionsError, match="^options must be a QuantizeOptions") as err:
        run_quantize(tmp_path / "no-model", tmp_path / "out", options={"mode": "dynamic"})
    assert err.value.field == "options" and not (tmp_path / "out").exists()


def test_activation_bits_are_said_wherever_an_activation_was_quantised_and_only_there():
    """A fused FFN quantises its hidden units whatever its layers ran alone: the report had said None."""
    from lmforge.quant.isa import activation_bits

    fp32 = [{"kernel": "fp32"}, {"kernel": "w8a32-serial"}]
    assert quantised_bits(fp32, []) is None and quantised_bits(fp32, [{"route": "plain"}]) is None
    assert quantised_bits(fp32, [{"route": "fused"}]) == activation_bits()
    assert quantised_bits([*fp32, {"kernel": "onednn-u8-serial"}], []) == activation_bits()



def test_the_size_before_counts_a_hugging_face_folder_s_bin_weights(tmp_path):
    """A folder of pytorch_model.bin measured 0 bytes before quantisation (quantize.json's before.bytes),
    and size_ratio divided the int8 model's bytes by 1."""
    import torch
    from safetensors.torch import load_file

    import lmforge
    from lmforge.compress.quantize_report import _sizes
    from tests.tasks.core import tiny

    model = tiny("bert-base", n_layers=1)
    lmforge.save(model, tmp_path / "m", format="hf")
    torch.save(load_file(tmp_path / "m" / "model.safetensors"), tmp_path / "m" / "pytorch_model.bin")
    (tmp_path / "m" / "model.safetensors").unlink()
    assert _sizes(model, tmp_path / "m")["bytes"] == (tmp_path / "m" / "pytorch_model.bin").stat().st_size


def test_a_seq_len_past_the_model_and_calibration_without_a_tokenizer_name_the_fields(tmp_path):
    """run_quantize said "--seq-len 100: ..." and "--calibration needs the model's tokenizer", flags the
    Python caller never gave (a plain ValueError): OptionsErrors naming seq_len and calibration."""
    import lmforge
    from lmforge.compress.quantize_options import QuantizeOptions
    from tests.tasks.core import tiny

    model = tiny("bert-base", n_layers=1)
    lmforge.save(model, tmp_path / "bare")  # no tokenizer beside it
    longer = model.config.max_seq_len + 1
    with pytest.raises(OptionsError) as seq_len:
        run_quantize(tmp_path / "bare", tmp_path / "q", options=QuantizeOptions(batch_size=1, seq_len=longer))
    assert str(seq_len.value).startswith(f"seq_len={longer}: the model reads at most")
    assert seq_len.value.field == "seq_len"
    fast = QuantizeOptions(batch_size=1, seq_len=8, rounds=1)
    with pytest.raises(OptionsError) as calibration:
        run_quantize(tmp_path / "bare", tmp_path / "q", calibration=["a text"], options=fast)
    assert str(calibration.value).startswith("calibration needs the model's tokenizer")
    assert calibration.value.field == "calibration" and not (tmp_path / "q").exists()
