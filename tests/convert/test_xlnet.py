"""XLNet's sequence summary: a non-default one is refused naming its field."""
import pytest

from lmforge.config import ConfigError
from lmforge.convert.hf import FAMILIES

HF = {"model_type": "xlnet", "architectures": ["XLNetForSequenceClassification"], "vocab_size": 99,
      "d_model": 32, "n_layer": 1, "n_head": 4, "d_inner": 64}


@pytest.mark.parametrize("field, value", [("summary_type", "first"), ("summary_use_proj", False),
                                          ("summary_activation", "relu")])
def test_a_sequence_summary_lmforge_lacks_is_refused_naming_its_field(field, value):
    """It said 'only XLNet's default sequence summary ... is supported', naming no field."""
    family = FAMILIES["xlnet"]
    assert family.heads["XLNetForSequenceClassification"](HF)[0][2]["pooling"] == "last"
    with pytest.raises(ConfigError, match=f"^{field}={value!r} is not supported"):
        family.heads["XLNetForSequenceClassification"]({**HF, field: value})
