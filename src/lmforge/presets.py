"""Named presets: each model family is data, with the source of its numbers.

`build(name, **overrides)` gives a randomly initialised model; `tiny(name)` the same
family at test size (every axis value kept, sizes shrunk).
"""
from __future__ import annotations


from lmforge.config import ConfigError, ModelConfig
from lmforge.config.names import close_names

# Counts (tests/test_presets_hf.py): a preset's backbone equals the reference library's model of the
# same checkpoint, except that BERT's pooler (d_model^2 + d_model: 0.59M in bert-base) is a head here
# (heads.py), so bert-base, roberta-*, albert-*, spanbert, longformer and bigbird count that much less
# than BertModel & co. (bert-base: 108.89M + 0.59M = 109.48M, the paper's "110M"). An untied LM head is
# a head too: mistral-7b's backbone is 7.11B, 7.24B with its 131M-parameter output projection.
BERT = dict(architecture="encoder", vocab_size=30522, max_seq_len=512, n_segments=2, position="learned",
            norm="layernorm", norm_placement="post", norm_eps=1e-12, ffn="gelu", embedding_norm=True)
ROBERTA = dict(BERT, vocab_size=50265, n_segments=1, position_offset=2, position_from_padding=True,
               norm_eps=1e-5)  # positions counted past the padding, as fairseq's make_positions
ALBERT = dict(BERT, vocab_size=30000, d_embed=128, share_layers=True, ffn="gelu-tanh",
              dropout=0.0, attention_dropout=0.0)
ELECTRA = dict(BERT, pooler_activation="gelu")  # its classification head: dense, gelu, out_proj
XLNET = dict(BERT, vocab_size=32000, n_segments=0, position="xl-relative", embedding_norm=False,
             attention_bias=False, lm_transform=False)
GPT = dict(architecture="decoder", vocab_size=40478, max_seq_len=512, n_segments=0, position="learned",
           norm="layernorm", norm_placement="post", norm_eps=1e-5, ffn="gelu-tanh", embedding_norm=False,
           final_norm=False, lm_transform=False, lm_bias=False)  # GELU: the tanh form of OpenAI's code
GPT2 = dict(GPT, vocab_size=50257, max_seq_len=1024, norm_placement="pre", final_norm=True, ffn="gelu-tanh")
T5 = dict(architecture="encoder-decoder", vocab_size=32128, max_seq_len=512, n_segments=0,
          position="relative-bias", norm="rmsnorm", norm_placement="pre", norm_eps=1e-6, norm_bias=False,
          ffn="relu", ffn_bias=False, attention_bias=False, attention_scaling=False, embedding_norm=False,
          lm_transform=False, lm_bias=False, tied_logit_scale=True, d_head=64)
BART = dict(architecture="encoder-decoder", vocab_size=50265, max_seq_len=1024, n_segments=0,
            position="learned", position_offset=2, norm="layernorm", norm_placement="post", norm_eps=1e-5,
            ffn="gelu", embedding_norm=True, lm_transform=False, lm_bias=True)
# Vaswani et al. 2017, "Attention is all you need": post-LN (sec. 3.1: LayerNorm(x + Sublayer(x))),
# sinusoidal positions (sec. 3.5), ReLU FFN with biases (eq. 2), one embedding matrix shared by both
# stacks and the pre-softmax projection, scaled by sqrt(d_model) (sec. 3.4), dropout on each
# sub-layer's output and on the embedding sums only (sec. 5.4: no attention dropout). Not in the
# paper, from its code (tensor2tensor): q/k/v/o projections without biases, LayerNorm eps 1e-6.
# max_seq_len only sizes the sinusoid table (no parameters; fairseq's default 1024).
TRANSFORMER = dict(architecture="encoder-decoder", vocab_size=37000, max_seq_len=1024, n_segments=0,
                   position="sinusoidal", scale_embeddings=True, embedding_norm=False, norm="layernorm",
                   norm_placement="post", norm_eps=1e-6, ffn="relu", attention_bias=False, dropout=0.1,
                   attention_dropout=0.0, tie_embeddings=True, lm_transform=False, lm_bias=False)
LLAMA = dict(architecture="decoder", n_segments=0, position="rotary", norm="rmsnorm", norm_placement="pre",
             norm_eps=1e-5, norm_bias=False, ffn="swiglu", ffn_bias=False, attention_bias=False,
             embedding_norm=False, lm_transform=False, lm_bias=False, dropout=0.0, attention_dropout=0.0)
BLOOM = dict(architecture="decoder", vocab_size=250880, max_seq_len=2048, n_segments=0, position="alibi",
             norm="layernorm", norm_placement="pre", norm_eps=1e-5, ffn="gelu-tanh", embedding_norm=True,
             lm_transform=False, lm_bias=False, dropout=0.0, attention_dropout=0.0)


def _size(d_model: int, n_layers: int, n_heads: int, d_ff: int | None = None) -> dict:
    return dict(d_model=d_model, n_layers=n_layers, n_heads=n_heads, d_ff=d_ff or 4 * d_model)


_VASWANI = ("Vaswani et al. 2017, Attention Is All You Need, Table 3 ({}) and sec. 5.4; "
            "37000-token shared BPE vocabulary of WMT 2014 EN-DE (sec. 5.1)")
_TURC = "Turc et al. 2019, Well-Read Students Learn Better (google-research/bert README)"
_ELECTRA = "Clark et al. 2020, ELECTRA, Table 6; google/electra-* configs"
PRESETS: dict = {
    "bert-tiny": dict(BERT, **_size(128, 2, 2), source=_TURC),
    "bert-mini": dict(BERT, **_size(256, 4, 4), source=_TURC),
    "bert-small": dict(BERT, **_size(512, 4, 8), source=_TURC),
    "bert-medium": dict(BERT, **_size(512, 8, 8), source=_TURC),
    "bert-base": dict(BERT, **_size(768, 12, 12), source="Devlin et al. 2019, BERT, sec. 3 (BERT-BASE)"),
    "bert-large": dict(BERT, **_size(1024, 24, 16), source="Devlin et al. 2019, BERT, sec. 3 (BERT-LARGE)"),
    "roberta-base": dict(ROBERTA, **_size(768, 12, 12),
                         source="Liu et al. 2019, RoBERTa; roberta-base config"),
    "roberta-large": dict(ROBERTA, **_size(1024, 24, 16),
                          source="Liu et al. 2019, RoBERTa; roberta-large config"),
    "distilbert-base": dict(BERT, **_size(768, 6, 12), n_segments=0, pooler_activation="relu",
                            source="Sanh et al. 2019, DistilBERT, sec. 3 (6 layers of BERT-base)"),
    "albert-base": dict(ALBERT, **_size(768, 12, 12), source="Lan et al. 2020, ALBERT, Table 1"),
    "albert-large": dict(ALBERT, **_size(1024, 24, 16), source="Lan et al. 2020, ALBERT, Table 1"),
    "albert-xlarge": dict(ALBERT, **_size(2048, 24, 16), source="Lan et al. 2020, ALBERT, Table 1"),
    "albert-xxlarge": dict(ALBERT, **_size(4096, 12, 64), source="Lan et al. 2020, ALBERT, Table 1"),
    # generator_size: the released generators (google/electra-*-generator): hidden 256 beside 256 / 768 / 1024
    "electra-small": dict(ELECTRA, **_size(256, 12, 4), d_embed=128, generator_size=1.0, source=_ELECTRA),
    "electra-base": dict(ELECTRA, **_size(768, 12, 12), generator_size=1 / 3, source=_ELECTRA),
    "electra-large": dict(ELECTRA, **_size(1024, 24, 16), generator_size=0.25, source=_ELECTRA),
    "electra-small-generator": dict(ELECTRA, **_size(256, 12, 4, 1024), d_embed=128, source=_ELECTRA),
    "electra-base-generator": dict(ELECTRA, **_size(256, 12, 4, 1024), d_embed=768, source=_ELECTRA),
    "electra-large-generator": dict(ELECTRA, **_size(256, 24, 4, 1024), d_embed=1024, source=_ELECTRA),
    "spanbert-base": dict(BERT, **_size(768, 12, 12), vocab_size=28996,
                          source="Joshi et al. 2020, SpanBERT, sec. 4 (BERT-base, cased vocabulary)"),
    "xlnet-base": dict(XLNET, **_size(768, 12, 12),
                       source="Yang et al. 2019, XLNet, sec. 3.1; xlnet-base-cased"),
    "xlnet-large": dict(XLNET, **_size(1024, 24, 16), source="Yang et al. 2019, XLNet, sec. 3.1"),
    "openai-gpt": dict(GPT, **_size(768, 12, 12), source="Radford et al. 2018, GPT, sec. 4.1"),
    "gpt2": dict(GPT2, **_size(768, 12, 12), source="Radford et al. 2019, GPT-2, Table 2"),
    "gpt2-medium": dict(GPT2, **_size(1024, 24, 16), source="Radford et al. 2019, GPT-2, Table 2"),
    "gpt2-large": dict(GPT2, **_size(1280, 36, 20), source="Radford et al. 2019, GPT-2, Table 2"),
    "gpt2-xl": dict(GPT2, **_size(1600, 48, 25), source="Radford et al. 2019, GPT-2, Table 2"),
    "transformer-base": dict(TRANSFORMER, **_size(512, 6, 8, 2048), source=_VASWANI.format("base")),
    "transformer-big": dict(TRANSFORMER, **_size(1024, 6, 16, 4096), dropout=0.3,
                            source=_VASWANI.format("big; P_drop 0.3 for EN-DE")),
    "t5-small": dict(T5, **_size(512, 6, 8, 2048),
                     source="Raffel et al. 2020, T5, sec. 3.7; t5-small config"),
    "t5-base": dict(T5, **_size(768, 12, 12, 3072), source="Raffel et al. 2020, T5, sec. 3.1.1"),
    "t5-large": dict(T5, **_size(1024, 24, 16, 4096), source="Raffel et al. 2020, T5, sec. 3.7"),
    "bart-base": dict(BART, **_size(768, 6, 12),
                      source="Lewis et al. 2020, BART, sec. 2.1; bart-base config"),
    "bart-large": dict(BART, **_size(1024, 12, 16), source="Lewis et al. 2020, BART, sec. 2.1"),
    "longformer-base": dict(ROBERTA, **_size(768, 12, 12), max_seq_len=4096, attention="longformer",
                            window=512, global_projections=True,
                            source="Beltagy et al. 2020, Longformer, sec. 5 (RoBERTa-base, window 512)"),
    "linformer-base": dict(ROBERTA, **_size(768, 12, 12), attention="linformer", linformer_k=256,
                           source="Wang et al. 2020, Linformer, sec. 5 (RoBERTa-base, n = 512, k = 256)"),
    "bigbird-base": dict(BERT, **_size(768, 12, 12), vocab_size=50358, max_seq_len=4096, attention="bigbird",
                         block_size=64, n_random_blocks=3, ffn="gelu-tanh",
                         source="Zaheer et al. 2020, BigBird, App. E (ITC, block 64, r=3); "
                                "bigbird-roberta-base"),
    "llama-3.2-1b": dict(LLAMA, **_size(2048, 16, 32, 8192), n_kv_heads=8, vocab_size=128256,
                         max_seq_len=131072, rotary_theta=500000.0, tie_embeddings=True,
                         rotary_scaling="llama3", rotary_scaling_factor=32.0, rotary_low_freq_factor=1.0,
                         rotary_high_freq_factor=4.0, rotary_original_max_len=8192,
                         source="Meta Llama 3.2 1B config (llama3 RoPE scaling from 8k to 128k context)"),
    "mistral-7b": dict(LLAMA, **_size(4096, 32, 32, 14336), n_kv_heads=8, vocab_size=32000,
                       max_seq_len=32768, attention="sliding-window", window=4096, tie_embeddings=False,
                       source="Jiang et al. 2023, Mistral 7B, Table 1"),
    "bloom-560m": dict(BLOOM, **_size(1024, 24, 16),
                       source="BigScience 2022, BLOOM, Table 3; bigscience/bloom-560m config"),
}

# ELMo (Peters et al. 2018): a biLSTM over characters (lmforge/elmo.py), not a Transformer, so kept out of
# PRESETS, whose every entry the Transformer contracts (tests/test_model.py) run over; get_config reads both.
# Sizes from AllenNLP's released options files (elmo_2x{lstm_dim}_{d_model}_2048cnn_{n_highway}xhighway):
# 2 layers, cell and projection clipping 3, residual connections, ReLU character CNN of 2048 filters
# (config.ELMO_FILTERS) over 16-d embeddings of 262 character ids, 50 per word. vocab_size is the softmax
# over the 1B Word Benchmark vocabulary (793471 words, bilm-tf's n_tokens_vocab), absent from the released
# weights. The parameter counts AllenNLP lists (13.6M, 28.0M, 93.6M) are the biLM without that softmax:
# character table, CNN, highways, projection and both directions' LSTMs, as num_parameters() counts.
ELMO = dict(architecture="elmo", vocab_size=793471, n_layers=2, n_heads=1, n_segments=0, max_seq_len=512,
            dropout=0.1, attention_dropout=0.0, tie_embeddings=False, lm_transform=False, lm_bias=True,
            char_embed_dim=16, char_filters=None, n_characters=262, max_characters_per_token=50,
            cell_clip=3.0, proj_clip=3.0, skip_connections=True)
_ALLENNLP_ELMO = "AllenNLP ELMo models page (allennlp.org/elmo): {} ({}M parameters), its options JSON"
ELMO_PRESETS: dict = {
    "elmo-small": dict(ELMO, d_model=128, lstm_dim=1024, n_highway=1,
                       source=_ALLENNLP_ELMO.format("Small, elmo_2x1024_128_2048cnn_1xhighway", 13.6)),
    "elmo-medium": dict(ELMO, d_model=256, lstm_dim=2048, n_highway=1,
                        source=_ALLENNLP_ELMO.format("Medium, elmo_2x2048_256_2048cnn_1xhighway", 28.0)),
    "elmo-original": dict(ELMO, d_model=512, lstm_dim=4096, n_highway=2,
                          source="Peters et al. 2018, ELMo, sec. 3.4 (2 biLSTM layers of 4096 units, 512-d "
                                 "projections, 2048 filters, 2 highway layers); " + _ALLENNLP_ELMO.format(
                                     "Original, elmo_2x4096_512_2048cnn_2xhighway", 93.6)),
}


def get_config(name: str, **overrides) -> ModelConfig:
    """The preset's ModelConfig with `overrides` applied (validated; one of no effect there refused)."""
    known = {**PRESETS, **ELMO_PRESETS}
    if not isinstance(name, str):  # None, a Path or a list failed as "not iterable" / "unhashable"
        raise ConfigError(f"the preset must be a preset name (text), got {type(name).__name__}", "name")
    if name not in known:
        close = close_names(name, known)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; presets: {', '.join(known)}"
        raise ConfigError(f"unknown preset {name!r}{hint}", "name")
    cfg = ModelConfig.from_dict(known[name])
    # with_overrides validates a copy again (1 ms a call): only for overrides, which it checks
    return cfg.with_overrides(**overrides) if overrides else cfg


def tiny_overrides(cfg: ModelConfig) -> dict:
    """Sizes that keep every axis value of `cfg` but make it cheap enough for tests and demos: those with an
    effect on it, so that get_config(name, **tiny_overrides(cfg)) does not refuse them."""
    sizes = _tiny_sizes(cfg)
    inert = cfg.replace(**sizes).inert_fields()  # a BERT's window, linformer_k ... (refused as overrides)
    return {name: value for name, value in sizes.items() if name not in inert}


def _tiny_sizes(cfg: ModelConfig) -> dict:
    """tiny_overrides' sizes, of no effect on `cfg` too: tiny() shrinks them all, so that an override of
    tiny(name, attention='sliding-window') finds a window that fits the tiny max_seq_len."""
    sizes = dict(vocab_size=99, d_model=32, n_layers=2, n_heads=4, d_head=None, d_ff=64, max_seq_len=64,
                 window=8, block_size=4, linformer_k=16, relative_buckets=8, relative_max_distance=16)
    if cfg.architecture == "elmo":  # small LSTMs and a character CNN of widths 1-3
        sizes.update(lstm_dim=64, char_embed_dim=8, char_filters=[[1, 8], [2, 8], [3, 16]])
    if cfg.n_kv_heads is not None:
        sizes["n_kv_heads"] = 1 if cfg.n_kv_heads == 1 else 2
    if cfg.attention_schedule is not None:
        sizes["attention_schedule"] = (cfg.attention_schedule * 2)[:2]
    if cfg.n_decoder_layers is not None:
        sizes["n_decoder_layers"] = 3
    if cfg.d_embed is not None and cfg.d_embed != cfg.d_model:
        sizes["d_embed"] = 16
    if cfg.rotary_dim is not None:
        sizes["rotary_dim"] = 4
    return sizes


def tiny(name: str, **overrides) -> ModelConfig:
    """A test-size config of the preset's family, with `overrides` applied (one of no effect refused)."""
    cfg = get_config(name)
    # the tiny sizes by replace(): some have no effect (a BERT's window), shrunk all the same so that
    # attention='sliding-window' finds a window within the tiny max_seq_len; the caller's names are checked
    return cfg.replace(**_tiny_sizes(cfg)).with_overrides(**overrides)
