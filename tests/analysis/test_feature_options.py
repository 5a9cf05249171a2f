"""FeatureOptions' layer selection: a hidden state named twice is refused naming layers and the index,
for every face built from the options (lmforge.features here; the CLI and /features in their own tests)."""
from __future__ import annotations

import pytest
import torch

import lmforge
from lmforge.analysis.feature_options import FeatureOptions
from lmforge.config.options import OptionsError


@pytest.mark.parametrize("layers, index", [("0,0,0", 0), ([3, 3], 3), ("0-3,2", 2), ("1,2-4,4", 4),
                                           ("-1, -1", -1)])
def test_a_layer_named_twice_is_refused_naming_it(layers, index):
    """'0,0,0' answered one layer, silently: the client counted three."""
    with pytest.raises(OptionsError, match=f"names layer {index} twice") as err:
        FeatureOptions(layers=layers)
    assert err.value.field == "layers"


def test_the_same_state_by_two_names_is_refused_once_the_model_says_how_many():
    """-1 and 4 are one state of five; only the model's depth tells."""
    options = FeatureOptions(layers="1,-1,4")
    with pytest.raises(OptionsError, match=r"names layer 4 twice \(here -1 is layer 4\)") as err:
        options.chosen(5)
    assert err.value.field == "layers"
    assert FeatureOptions(layers="1,-1").chosen(5) == [1, 4]


@pytest.mark.parametrize("layers, chosen", [("0,1", [0, 1]), ("0-2,3", [0, 1, 2, 3]), ([2, 0], [0, 2]),
                                            (-1, [4]), ("all", [0, 1, 2, 3, 4])])
def test_distinct_layers_are_all_chosen(layers, chosen):
    assert FeatureOptions(layers=layers).chosen(5) == chosen


@pytest.mark.parametrize("layers", ["\uff12", "\u0661", "0-\uff12", "\U0001d7d0"])
def test_a_layer_is_named_in_ascii_digits_as_attention_s_layers_are(layers):
    """A fullwidth 2, an Arabic-Indic 1 or a mathematical bold 2 was read as that layer (a str's \\d and
    int() take them), where the attention view's --layers and ?layers= refuse them."""
    from lmforge.analysis.attention import layer_list

    with pytest.raises(OptionsError, match="is not a layer index") as err:
        FeatureOptions(layers=layers)
    assert err.value.field == "layers"
    with pytest.raises(OptionsError):
        layer_list(layers, 5)


def test_the_python_face_raises_the_typed_error():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("elmo-small")).eval()
    with pytest.raises(OptionsError, match="names layer 0 twice") as err:
        lmforge.features(["the cat sat"], model, layers="0,0,0")
    assert err.value.field == "layers"
