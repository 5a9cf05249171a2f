"""io/resolve.py: what a name given for a model folder resolves to."""
import lmforge
from lmforge.io import model_dir


def test_a_model_object_or_a_preset_name_names_no_folder(tmp_path):
    """A model object given where a folder may be (run_heads, distill's teacher) is no path: None, not a
    TypeError from Path(model)."""
    model = lmforge.build(lmforge.tiny("bert-base"))
    assert model_dir(model) is None and model_dir("bert-base") is None and model_dir(3) is None
    model.save(tmp_path / "m")
    assert model_dir(tmp_path / "m") == tmp_path / "m"
