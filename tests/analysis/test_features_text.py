"""lmforge.features on texts: ELMo's words (their offsets, the scalar mix of its own layers), and the
options refused alike by the library (an OptionsError naming the field)."""
from __future__ import annotations

import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError


def test_elmo_features_are_its_word_layers_mixed_with_offsets():
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("elmo-small")).eval()
    found = lmforge.features(["the cat  sat", "a dog"], model, layers="mix", mix_weights=[1.0, 0.0, -1.0],
                             mix_gamma=0.5)
    assert [t["text"] for t in found[0].tokens] == ["the", "cat", "sat"]
    assert [(t["start"], t["end"]) for t in found[0].tokens] == [(0, 3), (4, 7), (9, 12)]
    states = model.word_layers([["the", "cat", "sat"]])[0]
    weights = torch.softmax(torch.tensor([1.0, 0.0, -1.0]), 0)
    torch.testing.assert_close(found[0].features[0], 0.5 * (weights[:, None, None] * states).sum(0),
                               atol=1e-6, rtol=0)
    top = lmforge.features(["a dog"], model, layers=-1, pooling="mean")[0]
    torch.testing.assert_close(top.features, model.word_layers([["a", "dog"]])[0][[-1]].mean(1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("fields, field", [({"layers": "7"}, "layers"), ({"pooling": "first"}, "pooling"),
                                           ({"layers": "mix", "mix_weights": [1.0]}, "mix_weights"),
                                           ({"max_length": 2, "layers": 0}, "truncate")])
def test_bad_options_name_the_field(fields, field):
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("elmo-small")).eval()
    with pytest.raises(OptionsError) as err:
        lmforge.features(["the cat sat"], model, **fields)
    assert err.value.field == field
