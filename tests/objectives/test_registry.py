"""The objective registry: every objective declares itself, and a new one is one file's worth of code."""
import ast
from pathlib import Path

import pytest
import torch.nn.functional as F

import lmforge
from lmforge.bakeoff import PlanError, check_plan
from lmforge.cli import build_parser, main
from lmforge.config import ARCHITECTURES
from lmforge.data.stream import ExampleFormat
from lmforge.heads import make_head
from lmforge.objectives import registry
from lmforge.objectives.base import Loss, Objective
from lmforge.presets import get_config, tiny_overrides
from lmforge.train import TrainConfig
from lmforge.train import pretrain as pretrain_module
from lmforge.train.pretrain import pretrain
from lmforge.utils.errors import OptionsError

SRC = Path(__file__).resolve().parents[2] / "src" / "lmforge"
TINY = dict(n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=64)


# --- what a new objective file holds: the class, its example format and its register(...) call ---

class CopyLM(Objective):
    """A toy: each position predicts its own token through the LM head (no corruption at all)."""

    name = "toy-copy"

    def __init__(self, model, pad_id: int = 0) -> None:
        super().__init__(model, pad_id)
        self.lm = make_head(model, "lm")

    def forward(self, batch: dict) -> Loss:
        """Cross-entropy of each real token given the whole (uncorrupted) input."""
        hidden = self.model(batch["input_ids"], batch["attention_mask"], run_heads=False).last_hidden_state
        real = batch["attention_mask"].bool()
        return Loss(F.cross_entropy(self.lm(hidden[real]).float(), batch["input_ids"][real]))

    def heads(self) -> dict:
        """The LM head, saved with the model."""
        return {"lm": self.lm}


def first_sentences(docs, tokenizer, max_len, seed):
    """[CLS] each document's first sentence [SEP]: an example format of the toy's own."""
    cls, sep = tokenizer.special_id("cls"), tokenizer.special_id("sep")
    return [{"input_ids": [cls, *doc[0][:max_len - 2], sep]} for doc in docs if doc]


TOY = registry.ObjectiveSpec(name="toy-copy", build=CopyLM.build, summary="copy each token (a test toy)",
                             aliases=("copy",), architectures=("encoder",), tokenizer="bert",
                             examples=ExampleFormat("custom", build=first_sentences))


@pytest.fixture
def toy():
    """The toy registered as its file would register it, and gone again after the test."""
    yield registry.register(TOY)
    registry.unregister(TOY.name)


# --- the tests ---

@pytest.mark.usefixtures("few_probes")  # tests/conftest.py
def test_a_new_objective_trains_through_pretrain_and_the_cli(toy, tmp_path, capsys):
    train = TrainConfig(steps=2, batch_size=2, progress=False)
    model = pretrain("copy", tmp_path, train, preset="bert-tiny", n_docs=60,
                     overrides={**TINY, "vocab_size": 300}, log=lambda *a: None)
    assert model.config.architecture == "encoder" and "lm" in lmforge.load(tmp_path / "final").heads
    assert (tmp_path / "metrics.jsonl").is_file()
    # the parser is built on each run (cli.main), after the registration: it lists and takes the toy
    parser = build_parser()
    for name in ("toy-copy", "copy"):
        args = parser.parse_args(["pretrain", "--preset", "bert-tiny", "--objective", name, "--out", "x"])
        assert registry.get(args.objective) is toy
    with pytest.raises(SystemExit):
        parser.parse_args(["pretrain", "--help"])
    assert "toy-copy: copy each token" in " ".join(capsys.readouterr().out.split())


def test_aliases_resolve_to_the_same_spec():
    for alias, name in (("electra", "rtd"), ("structbert", "structural"), ("bert", "nsp"),
                        ("t5", "span-corruption"), ("bart", "denoising"), ("xlnet", "plm"),
                        ("distilbert", "distillation"), ("gpt", "clm")):
        assert registry.get(alias) is registry.get(name) and registry.get(alias).name == name
    assert set(registry.aliases().values()) <= set(registry.names())


def test_an_unknown_name_is_a_one_line_error_naming_the_choices():
    with pytest.raises(ValueError) as err:
        registry.get("mlmm")
    message = str(err.value)
    assert "\n" not in message and "'mlmm'" in message and "electra=rtd" in message
    assert all(name in message for name in registry.names())
    with pytest.raises(ValueError, match="unknown objective 'mlmm'"):
        pretrain("mlmm", "unused", TrainConfig(steps=1), preset="bert-tiny")
    with pytest.raises(SystemExit) as exit_:  # the CLI refuses it before any work, with status 2
        build_parser().parse_args(["pretrain", "--preset", "bert-tiny", "--objective", "mlmm", "--out", "x"])
    assert exit_.value.code == 2


def test_every_objective_declares_what_pretrain_needs():
    assert registry.names()[:4] == ("mlm", "wwm", "nsp", "sop") and len(registry.names()) >= 13
    for spec in registry.specs():
        assert spec.architectures and set(spec.architectures) <= set(ARCHITECTURES), spec.name
        assert spec.tokenizer in registry.TOKENIZER_KINDS and spec.summary, spec.name
        assert isinstance(spec.examples, ExampleFormat) and callable(spec.build), spec.name
    assert registry.get("wwm").options == {"whole_word": True} and registry.get("wwm").examples.word_starts
    assert registry.get("sop").options == {"task": "sop"} and registry.get("sop").examples.pairs == "sop"
    assert [registry.get(n).tokenizer for n in ("mlm", "clm", "span-corruption", "denoising")] == \
        ["bert", "gpt2", "t5", "roberta"]
    with pytest.raises(ValueError, match="tokenizer family 'sentencepiece'"):
        registry.ObjectiveSpec(name="x", build=CopyLM.build, architectures=("encoder",),
                               tokenizer="sentencepiece", examples=ExampleFormat())
    with pytest.raises(ValueError, match="architectures"):
        registry.ObjectiveSpec(name="x", build=CopyLM.build, architectures=("rnn",), tokenizer="bert",
                               examples=ExampleFormat())


def test_an_architecture_the_objective_does_not_train_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"'rtd' does not fit a decoder \(gpt2\): it trains encoder models"):
        registry.get("electra").check(get_config("gpt2"), "gpt2")
    with pytest.raises(ValueError,
                       match="'span-corruption' does not fit a decoder .* encoder-decoder models"):
        pretrain("t5", tmp_path, TrainConfig(steps=1), preset="gpt2", overrides=TINY)
    with pytest.raises(ValueError, match="'plm' does not fit position='learned'.*xl-relative"):
        registry.get("plm").check(get_config("bert-tiny"), "bert-tiny")
    with pytest.raises(ValueError, match=r"'clm' does not fit an encoder \(bert-tiny\)"):
        registry.get("clm").check(get_config("bert-tiny"), "bert-tiny")
    registry.get("prefix-lm").check(get_config("gpt2"))
    registry.get("prefix-lm").check(get_config("t5-small"))
    assert not (tmp_path / "tokenizer").exists()  # refused before any work


# each pair crashed at the first step: segment id 1 past a one-row segment table (IndexError), a prefix-LM
# mask under sliding-window attention (the stack's ValueError); now the spec refuses it, naming why
REFUSED = [("nsp", "roberta-base", "n_segments=1 (roberta-base): its sentence pairs take segment ids 0, 1"),
           ("sop", "longformer-base", "n_segments=1 (longformer-base)"),
           ("structural", "linformer-base", "n_segments=1 (linformer-base)"),
           ("prefix-lm", "mistral-7b", "attention='sliding-window' (mistral-7b): a decoder's prefix LM needs "
                                       "full attention in every layer")]


def _small(preset: str) -> dict:
    """Test sizes of the preset's family, the vocabulary left to the tokenizer trained for the run."""
    return {k: v for k, v in tiny_overrides(get_config(preset)).items() if k != "vocab_size"}


@pytest.mark.parametrize("name, preset, said", REFUSED)
def test_a_model_the_objective_cannot_train_is_refused_before_the_corpus_is_read(tmp_path, monkeypatch,
                                                                                 name, preset, said):
    def no_read(*args, **kwargs):
        raise AssertionError("the corpus was read")

    monkeypatch.setattr(pretrain_module, "read_documents", no_read)
    (tmp_path / "text.txt").write_text("One sentence here. Another one there.\n")
    with pytest.raises(OptionsError) as err:
        pretrain(name, tmp_path / "run", TrainConfig(steps=1), preset=preset, overrides=_small(preset),
                 data=[str(tmp_path / "text.txt")])
    message = str(err.value)
    assert err.value.field == "objective" and "\n" not in message
    assert message.startswith(f"objective {name!r} does not fit ") and said in message, message
    assert not (tmp_path / "run" / "tokenizer").exists()


@pytest.mark.parametrize("name, preset, said", REFUSED)
def test_the_command_line_and_a_bake_off_plan_refuse_the_same_pairs(tmp_path, capsys, name, preset, said):
    flags = [f"{k}={v}" for k, v in _small(preset).items() if isinstance(v, int)]  # the sizes
    assert main(["pretrain", "--preset", preset, "--objective", name, "--out", str(tmp_path / "run"),
                 "--steps", "1", *flags]) == 2
    assert said in capsys.readouterr().err and not (tmp_path / "run" / "tokenizer").exists()
    plan = {"name": "p", "budget": 4.0e8, "corpus": {"source": "builtin", "documents": 120},
            "tokenizer": {"family": "bert", "vocab_size": 300},
            "pretrain": {"max_len": 32, "batch_size": 8, "lr": 1e-3, "warmup": 2},
            "finetune": {"steps": 6, "batch_size": 8, "lr": 1e-3, "warmup": 0, "max_len": 32},
            "tasks": [{"name": "sentiment", "source": "builtin", "n": 40}], "seeds": [0],
            "arms": [{"name": "arm", "objective": name, "preset": preset, "overrides": _small(preset)}]}
    with pytest.raises(PlanError) as err:
        check_plan(plan, "my.yaml")
    assert str(err.value).startswith("my.yaml: arms[0].objective: ") and said in str(err.value), err.value


def _fits(name: str, cfg) -> bool:
    try:
        registry.get(name).check(cfg, "a preset")
    except OptionsError:
        return False
    return True


def test_the_pairs_that_crashed_before_still_fit_where_they_can():
    for name in ("nsp", "sop", "structural"):  # two segment types, or none (DistilBERT: ids not embedded)
        assert _fits(name, get_config("bert-base")) and _fits(name, get_config("distilbert-base")), name
        assert not _fits(name, get_config("bert-base", n_segments=1)), name  # as an override too
    assert _fits("prefix-lm", get_config("mistral-7b", attention="full"))
    assert not _fits("prefix-lm", get_config("gpt2", attention_schedule=["full"] * 11 + ["sliding-window"],
                                             window=8))
    # an encoder-decoder's prefix LM splits the text, no mask: any attention; a window is no problem for clm
    assert _fits("prefix-lm", get_config("t5-small", attention="sliding-window", window=8))
    assert _fits("clm", get_config("mistral-7b"))


def test_a_name_is_registered_once(toy):
    with pytest.raises(ValueError, match="'electra' is taken by 'rtd'"):
        registry.register(registry.ObjectiveSpec(name="electra", build=CopyLM.build,
                                                 architectures=("encoder",), tokenizer="bert",
                                                 examples=ExampleFormat()))
    with pytest.raises(ValueError, match="'bert' is taken by 'nsp'"):
        registry.register(registry.ObjectiveSpec(name="toy-2", aliases=("bert",), build=CopyLM.build,
                                                 architectures=("encoder",), tokenizer="bert",
                                                 examples=ExampleFormat()))
    assert "toy-2" not in registry.names() and registry.get("bert").name == "nsp"


@pytest.mark.parametrize("path", ["train/pretrain.py", "cli/pretrain.py", "data/stream.py"])
def test_the_recipe_cli_and_data_never_test_an_objective_name(path):
    known = set(registry.names()) | set(registry.aliases())
    for node in ast.walk(ast.parse((SRC / path).read_text())):
        if isinstance(node, ast.Compare):
            strings = {c.value for c in ast.walk(node)
                       if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            assert not strings & known, f"{path}:{node.lineno} compares with {strings & known}"
