import pytest
import torch

import lmforge
from lmforge.config import ConfigError
from lmforge.model import from_config
from lmforge.presets import PRESETS

# Published backbone sizes (the figures the papers round, as the reference library counts
# them). Families whose reference backbone carries BERT's pooler are marked: for them the
# pooler (d_model^2 + d_model, a head in lmforge) is added before comparing.
PUBLISHED_M = {
    "bert-tiny": (4.4, True), "bert-mini": (11.2, True), "bert-small": (28.8, True),
    "bert-medium": (41.4, True), "bert-base": (109.5, True), "bert-large": (335, True),
    "roberta-base": (125, True), "albert-base": (11.7, True), "albert-large": (17.7, True),
    "albert-xlarge": (58.7, True), "albert-xxlarge": (223, True), "distilbert-base": (66.4, False),
    "electra-small": (13.5, False), "electra-base": (109, False), "electra-large": (334, False),
    "openai-gpt": (116.5, False), "gpt2": (124, False), "gpt2-medium": (355, False),
    "gpt2-large": (774, False), "gpt2-xl": (1558, False), "t5-small": (60.5, False),
    "t5-base": (223, False), "t5-large": (738, False), "bart-base": (139, False),
    "bart-large": (406, False), "xlnet-base": (117, False), "xlnet-large": (360, False),
    "longformer-base": (149, True), "bigbird-base": (127, True), "bloom-560m": (560, False),
}


@pytest.mark.parametrize("name", list(PUBLISHED_M))
def test_parameter_count_matches_the_paper(name):
    cfg = lmforge.get_config(name)
    with torch.device("meta"):
        model = from_config(cfg, init=False)
    published, with_pooler = PUBLISHED_M[name]
    count = model.num_parameters() + (cfg.d_model ** 2 + cfg.d_model if with_pooler else 0)
    # the published figures are rounded to 3-4 significant digits, so allow that rounding plus 1 %
    assert abs(count / 1e6 - published) <= 0.01 * published + 0.05, f"{name}: {count / 1e6:.2f}M"


def test_every_preset_names_its_source():
    for name, preset in PRESETS.items():
        assert preset["source"], name
        assert lmforge.get_config(name).source == preset["source"]


def test_unknown_preset_suggests_close_names():
    with pytest.raises(ConfigError, match="unknown preset 'bert-bse'; did you mean bert-base"):
        lmforge.build("bert-bse")


def test_build_applies_overrides():
    model = lmforge.build("gpt2", n_layers=2, d_model=64, n_heads=4, d_ff=128, vocab_size=101)
    assert model.config.n_layers == 2 and model.tokens.weight.shape == (101, 64)
    assert len(model.decoder.blocks) == 2


def test_modern_decoder_is_rope_rmsnorm_swiglu_gqa():
    cfg = lmforge.get_config("llama-3.2-1b")
    assert (cfg.position, cfg.norm, cfg.ffn) == ("rotary", "rmsnorm", "swiglu")
    assert cfg.kv_heads < cfg.n_heads
