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


@pytest.mark.parametrize("given, read", [("2.0", 2), (" -1.0 ", -1), ([0, 2.0], [0, 2]), ((1.0,), [1])])
def test_layers_reads_a_whole_number_as_layers_2_0_is_read(given, read):
    """layers=2.0 was layer 2 (lmforge.features, POST /features) while `lmforge features --layers 2.0` and
    layers=[0, 2.0] were refused: a whole float's text and a list's whole floats read as their ints too."""
    assert FeatureOptions(layers=given).layers == read
    assert FeatureOptions.build(fields={"layers": given}, from_text=True).layers == read  # the command line's
    assert FeatureOptions(layers=given).chosen(3) == FeatureOptions(layers=read).chosen(3)
    for bad in ("2.5", "2.", [0, 2.5], "1e0"):  # a fraction, or no digit after the point: still refused
        with pytest.raises(OptionsError, match="layers") as err:
            FeatureOptions(layers=bad)
        assert err.value.field == "layers"
