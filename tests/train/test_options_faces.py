"""The training options' two faces, Python (TrainConfig.from_dict) and the command line (`lmforge
pretrain ... key=value`), accept and refuse the same values: drawn at random inside and outside each
field's bounds, of the wrong type and non-finite. A refusal is one line naming the field (exit 2 on
the command line, an OptionsError in Python), before any work."""
import dataclasses
import math

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import lmforge.train.pretrain as pretrain_module
from lmforge.cli import main
from lmforge.cli.common import parse_overrides
from lmforge.config import OptionsError
from lmforge.train import TrainConfig
from lmforge.train.config import MAX_STEPS

FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
WORDS = st.sampled_from(["fast", "abc", "maybe", "cpu", "cuda:7", "tpu9", "linear", "cosine", "bf16", "ddp",
                         "auto", "fp16", "0.9,0.98", "1e-3", "12"])
WRONG = st.one_of(st.booleans(), WORDS, st.none(), st.lists(st.integers(-3, 3), max_size=3),
                  st.floats(allow_nan=True, allow_infinity=True))


def values(name: str):
    """Values of field `name`: inside its bounds, outside them, of another type, non-finite."""
    f = FIELDS[name]
    kind, meta = f.type.replace("Optional[", "").rstrip("]"), f.metadata
    low, high = meta.get("low"), meta.get("high")
    if kind == "int":
        return st.one_of(st.integers(low, high), st.integers(max_value=low - 1),
                         st.integers(min_value=high + 1, max_value=high * 4), WRONG)
    if kind == "float":
        return st.one_of(st.floats(low, high), st.floats(max_value=low), st.floats(min_value=high), WRONG)
    if kind == "bool":
        return st.one_of(st.booleans(), st.integers(0, 1), WRONG)
    if kind == "tuple":  # betas
        return st.one_of(st.lists(st.floats(-0.5, 1.5), min_size=1, max_size=3), WRONG)
    return st.one_of(st.sampled_from(meta.get("choices") or ("auto", "cpu")), WRONG)


def as_text(value) -> str:
    """`value` as written after key= on the command line."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, list):
        return "[" + ",".join(map(as_text, value)) + "]"
    return repr(value) if isinstance(value, float) else str(value)


def same(a, b) -> bool:
    """Equal, NaN equal to NaN, a bool never equal to a number."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def python_face(data: dict):
    """(TrainConfig, None) or (None, the OptionsError)."""
    try:
        return TrainConfig.from_dict(data), None
    except OptionsError as err:
        return None, err


class Ran:
    """pretrain() stood in for: the command line's work ends at the call, which records its arguments."""

    def __init__(self):
        self.calls = []

    def __call__(self, objective, out, train, recipe=None, inputs=None, **fields):
        self.calls.append((train, recipe, inputs))


@pytest.fixture
def ran(monkeypatch):
    stub = Ran()
    monkeypatch.setattr(pretrain_module, "pretrain", stub)
    return stub


def cli_face(ran, capsys, out, pair: str, steps: bool):
    """(TrainConfig the command line built, exit status, stderr) with key=value before the flags."""
    ran.calls.clear()
    args = ["pretrain", pair, "--preset", "bert-mini", "--objective", "mlm", "--out", out]
    status = main(args + (["--steps", "3"] if steps else []))
    err = capsys.readouterr().err
    return (ran.calls[0][0] if ran.calls else None), status, err


@settings(max_examples=40, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_both_faces_accept_and_refuse_alike(data, ran, capsys, tmp_path):
    name = data.draw(st.sampled_from(sorted(FIELDS)), label="field")
    value = data.draw(values(name), label="value")
    text = as_text(value)
    assume(same(parse_overrides([f"{name}={text}"])[name], value))  # the text says what the object is
    steps = name not in ("epochs", "steps")  # epochs are instead of --steps; --steps would win over steps=
    cfg, err = python_face({"seed": 0, **({"steps": 3} if steps else {}), name: value})
    built, status, said = cli_face(ran, capsys, str(tmp_path / "out"), f"{name}={text}", steps)
    event("accepted" if err is None else "refused")
    if err is None:
        assert status == 0 and built == cfg, (name, value, said)
    else:
        assert err.field == name and name in str(err) and "\n" not in str(err), (name, value, err)
        assert status == 2 and built is None, (name, value, status)
        assert len(said.strip().splitlines()) == 1 and name in said and "Traceback" not in said, said
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", sorted(n for n, f in FIELDS.items() if f.type.replace("Optional[", "")
                                        .rstrip("]") in ("int", "float")))
def test_every_number_is_bounded_both_ways(name):
    meta = FIELDS[name].metadata
    assert meta["low"] is not None and meta["high"] is not None, name
    for beyond in (meta["high"] * 2 + 1, meta["low"] - 1, float("nan")):
        with pytest.raises(OptionsError, match=f"^{name} must be") as caught:
            TrainConfig.from_dict({"steps": 3, name: beyond} if name != "epochs" else {name: beyond})
        assert caught.value.field == name


@pytest.mark.parametrize("order", [
    ["steps=3", "--preset", "bert-mini", "--objective", "mlm", "--out", "OUT", "lr=0.5", "--data", "a.txt"],
    ["--preset", "bert-mini", "--data", "a.txt", "steps=3", "--objective", "mlm", "lr=0.5", "--out", "OUT"],
    ["--out", "OUT", "--objective", "mlm", "--preset", "bert-mini", "--data", "a.txt", "steps=3", "lr=0.5"],
])
def test_key_values_are_taken_in_any_order_around_the_flags(order, ran, tmp_path):
    out = str(tmp_path / "o")
    assert main(["pretrain", *[out if a == "OUT" else a for a in order]]) == 0
    (train, _, inputs), = ran.calls
    assert (train.steps, train.lr) == (3, 0.5) and inputs.data == ["a.txt"]


def test_a_key_value_is_kept_as_the_value_of_a_one_value_flag(ran, tmp_path):
    out = str(tmp_path / "x=1")  # a folder whose name holds =: the value of --out, not an override
    assert main(["pretrain", "--preset", "bert-mini", "--objective", "mlm", "--out", out, "warmup=2"]) == 0
    assert ran.calls[0][0].warmup == 2


def test_vocab_size_sizes_the_tokenizer_trained_here(ran, tmp_path):
    assert main(["pretrain", "--preset", "bert-mini", "--objective", "mlm", "--out", str(tmp_path / "o"),
                 "vocab_size=500"]) == 0
    inputs = ran.calls[0][2]
    assert inputs.overrides["vocab_size"] == 500 and inputs.vocab_size() == 500


def test_vocab_size_against_a_given_tokenizer_is_refused_before_any_work(ran, tmp_path, capsys):
    from lmforge.tokenizer import train_tokenizer

    tok = train_tokenizer(["the cat sat on the mat"] * 20, "wordpiece", 60).save(tmp_path / "tok")
    ids = __import__("lmforge").load_tokenizer(tok).vocab_size
    args = ["pretrain", "--preset", "bert-mini", "--objective", "mlm", "--tokenizer", str(tok),
            "--out", str(tmp_path / "o")]
    assert main([*args, f"vocab_size={ids + 100}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"vocab_size={ids + 100} conflicts" in err and not ran.calls
    assert main([*args, f"vocab_size={ids}"]) == 0 and len(ran.calls) == 1  # the same size: nothing to say


def test_a_replaced_vocab_size_is_said(tmp_path):
    from lmforge.tokenizer import train_tokenizer

    tok = train_tokenizer(["the cat sat on the mat"] * 20, "wordpiece", 60)
    text = tmp_path / "corpus.txt"  # files given: no cloze probes scored (they take seconds)
    text.write_text("the cat sat on the mat.\n\n" * 40)
    said = []
    tiny = dict(n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=64, vocab_size=500)
    train = TrainConfig(steps=1, batch_size=2, progress=False, warmup=0)
    model = pretrain_module.pretrain("mlm", tmp_path / "o", train, preset="bert-tiny", data=[str(text)],
                                     tokenizer=tok, overrides=tiny, log=said.append)
    assert model.config.vocab_size == tok.vocab_size
    assert f"vocab_size=500: the model takes the tokenizer's {tok.vocab_size} ids instead" in said


def test_steps_bound_is_the_listed_one():
    assert FIELDS["steps"].metadata["high"] == MAX_STEPS == FIELDS["warmup"].metadata["high"]


@pytest.mark.parametrize("pair, message", [("max_len=1", "max_len must be an integer >= 2"),
                                           ("max_len=abc", "max_len must be an integer"),
                                           ("add_tokens=[1]", "add_tokens must be a string")])
def test_recipe_options_are_typed_and_bounded(pair, message, ran, tmp_path, capsys):
    args = ["pretrain", "--preset", "bert-mini", "--objective", "mlm", pair, "--out", str(tmp_path)]
    assert main(args) == 2
    assert message in capsys.readouterr().err and not ran.calls
