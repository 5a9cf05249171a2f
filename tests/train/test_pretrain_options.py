"""pretrain()'s knobs come from its options objects (RecipeOptions, PretrainInputs) or their fields as
keywords; the Python face and `lmforge pretrain` accept and refuse alike: a misspelt, mistyped or
out-of-range field is one line naming it (an OptionsError; exit 2), before any work."""
import dataclasses
import json

import pytest

import lmforge.train.pretrain as pretrain_module
from lmforge.cli import main
from lmforge.config import OptionsError
from lmforge.train import TrainConfig
from lmforge.train.pretrain import PretrainInputs, RecipeOptions, pretrain
from lmforge.train.pretrain_options import (MAX_DATA_PATHS, MAX_DUPLICATION, MAX_OBJECTIVE_OPTIONS,
                                          MAX_OVERRIDES, recipe_and_inputs)

TINY = {"n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64, "max_seq_len": 64}
NUMBERS = [f for f in dataclasses.fields(RecipeOptions) if f.type.replace("Optional[", "").rstrip("]")
           in ("int", "float")]


class Ran:
    """pretrain() stood in for: the command line's work ends at the call, which records its options."""

    def __init__(self):
        self.calls = []

    def __call__(self, objective, out, train, recipe=None, inputs=None, **fields):
        self.calls.append((recipe, inputs))


@pytest.fixture
def ran(monkeypatch):
    stub = Ran()
    monkeypatch.setattr(pretrain_module, "pretrain", stub)
    return stub


def cli(out, *args) -> list:
    return ["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--out", str(out), *args]


def refused_in_python(out, **fields) -> OptionsError:
    """The OptionsError pretrain() raises for `fields`, having written nothing."""
    with pytest.raises(OptionsError) as caught:
        pretrain("mlm", out, TrainConfig(steps=1), preset="bert-tiny", **fields)
    assert "\n" not in str(caught.value) and not out.exists()
    return caught.value


def refused_on_the_command_line(capsys, args) -> str:
    """The one line `lmforge pretrain ARGS` exits 2 with."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("field", NUMBERS, ids=lambda f: f.name)
def test_every_recipe_number_is_bounded_both_ways_on_both_faces(field, capsys, tmp_path):
    low, high = field.metadata["low"], field.metadata["high"]
    assert low is not None and high is not None, field.name  # every cost a client chooses is bounded
    for beyond in (high + 1, high * 10 ** 6, low - 1):
        err = refused_in_python(tmp_path / "o", **{field.name: beyond})
        assert err.field == field.name and str(err).startswith(f"{field.name} must be"), err
        said = refused_on_the_command_line(capsys, cli(tmp_path / "o", f"{field.name}={beyond}"))
        assert f"{field.name} must be" in said and not (tmp_path / "o").exists()


def test_duplication_past_its_bound_is_refused_by_flag_key_value_and_python(ran, capsys, tmp_path):
    out = tmp_path / "o"
    for args in (["--duplication", "1e8"], ["--duplication", str(MAX_DUPLICATION + 1)], ["duplication=1e8"]):
        said = refused_on_the_command_line(capsys, cli(out, *args))
        assert f"duplication must be an integer >= 0 and <= {MAX_DUPLICATION}" in said, said
    said = refused_on_the_command_line(capsys, cli(out, "--duplication", "2.5"))
    assert "duplication must be a whole number" in said
    assert not ran.calls and not out.exists()
    assert refused_in_python(out, duplication=10 ** 8).field == "duplication"
    assert refused_in_python(out, recipe=RecipeOptions(), duplication=-1).field == "duplication"
    with pytest.raises(OptionsError, match="^duplication must be") as caught:
        RecipeOptions(duplication=MAX_DUPLICATION + 1)
    assert caught.value.field == "duplication"
    assert main(cli(out, "--duplication", str(MAX_DUPLICATION))) == 0  # the bound itself is allowed
    assert main(cli(out, "duplication=1e1")) == 0  # 1e1 is ten, written as key=value's text is
    assert [recipe.duplication for recipe, _ in ran.calls] == [MAX_DUPLICATION, 10]


def test_a_misspelt_field_is_an_options_error_naming_it(capsys, tmp_path):
    err = refused_in_python(tmp_path / "o", duplicaton=2)
    assert err.field == "duplicaton" and "option duplicaton;" in str(err) and "duplication" in str(err)
    assert "help(lmforge.train.pretrain.pretrain)" in str(err)  # where the names are listed
    said = refused_on_the_command_line(capsys, cli(tmp_path / "o", "duplicaton=2"))
    assert "duplicaton" in said and not (tmp_path / "o").exists()
    assert refused_in_python(tmp_path / "o", data="corpus.txt").field == "data"  # a list of files
    assert refused_in_python(tmp_path / "o", n_docs=True).field == "n_docs"  # a bool is not a number
    assert refused_in_python(tmp_path / "o", log="print").field == "log"
    with pytest.raises(OptionsError, match="train must be a TrainConfig"):
        pretrain("mlm", tmp_path / "o", {"steps": 1}, preset="bert-tiny")


def test_keywords_change_the_options_objects_they_belong_to():
    given = RecipeOptions(max_len=16, duplication=2), PretrainInputs(preset="gpt2")
    recipe, inputs = recipe_and_inputs(*given, {"max_len": 8, "model": None, "n_docs": 5.0})
    assert (recipe.max_len, recipe.duplication, recipe.n_docs) == (8, 2, 5)  # 5.0 is the whole number 5
    assert inputs.preset == "gpt2" and inputs.vocab_size() == 1000
    assert recipe_and_inputs(None, None, {"overrides": {"vocab_size": 300}})[1].vocab_size() == 300


def test_n_docs_is_a_key_value_of_the_command_line(ran, tmp_path):
    assert main(cli(tmp_path / "o", "n_docs=50", "--max-len", "32")) == 0
    (recipe, inputs), = ran.calls
    assert (recipe.n_docs, recipe.max_len, recipe.duplication) == (50, 32, 0)
    assert "n_docs" not in inputs.overrides  # a recipe option, not a model config field


def test_a_run_from_the_options_objects_reaches_the_trainer(tmp_path):
    text = tmp_path / "corpus.txt"  # files given: no cloze probes scored
    text.write_text("the cat sat on the mat.\n\nthe dog ran to the cat.\n\n" * 20)
    said = []
    train = TrainConfig(steps=1, batch_size=2, progress=False, warmup=0)
    inputs = PretrainInputs(preset="bert-tiny", data=[str(text)], overrides={**TINY, "vocab_size": 200},
                            log=said.append)
    model = pretrain("mlm", tmp_path / "o", train, RecipeOptions(max_len=16, duplication=3), inputs)
    assert (tmp_path / "o" / "final" / "tokenizer.json").is_file() and model.config.d_model == 32
    assert any("duplication=3 is not below" in line for line in said), said  # the Trainer got the copies
    recorded = json.loads(next((tmp_path / "o" / "checkpoints").glob("*/trainer.json")).read_text())
    from lmforge.data.read_options import ReadOptions

    assert recorded["settings"] == {"duplication": 3, "objective_options": {}, "max_len": 16,  # to rerun it
                                    "read": ReadOptions().to_dict()}


def test_an_add_tokens_file_past_its_bound_is_refused_naming_it(tmp_path, monkeypatch):
    words = tmp_path / "words.txt"
    words.write_text("alpha\nbeta\nalpha\n\ngamma\n")
    assert pretrain_module.read_words(words) == ["alpha", "beta", "gamma"]
    monkeypatch.setattr(pretrain_module, "MAX_ADDED_WORDS", 2)  # the bound is 65536; three words pass it here
    with pytest.raises(ValueError, match=r"words.txt: more than 2 words to add \(add_tokens\)"):
        pretrain_module.read_words(words)


@pytest.mark.parametrize("objective, preset", [("clm", "gpt2"), ("bilm", "elmo-medium")])
def test_duplication_with_an_objective_that_draws_no_corruption_is_refused(capsys, tmp_path, objective,
                                                                           preset):
    said = f"duplication=3: objective {objective} draws no corruption"
    with pytest.raises(OptionsError, match=f"^{said}") as err:
        pretrain(objective, tmp_path / "o", TrainConfig(steps=1), preset=preset, duplication=3)
    assert err.value.field == "duplication" and not (tmp_path / "o").exists()
    args = ["pretrain", "--preset", preset, "--objective", objective, "--out", str(tmp_path / "o")]
    assert said in refused_on_the_command_line(capsys, [*args, "--duplication", "3"])
    assert not (tmp_path / "o").exists()


def test_n_docs_beside_data_is_refused_as_unread(capsys, tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("the cat sat on the mat.\n\n" * 4)
    err = refused_in_python(tmp_path / "o", data=[str(text)], n_docs=50)
    assert err.field == "n_docs" and "not read when data (--data) is given" in str(err)
    said = refused_on_the_command_line(capsys, cli(tmp_path / "o", "--data", str(text), "n_docs=50"))
    assert said.endswith("n_docs=50: sizes the built-in corpus, which is not read when data (--data) is "
                         "given; drop it")


def test_a_config_files_number_in_exponent_form_is_read_as_trainconfigs_are(ran, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("max_len: 3.2e1\nduplication: 1e1\nn_docs: 5e1\nlr: 1e-3\n")  # YAML 1.1: text, all four
    assert main(cli(tmp_path / "o", "--config", str(config))) == 0  # the recipe's were refused, lr's read
    (recipe, _), = ran.calls
    assert (recipe.max_len, recipe.duplication, recipe.n_docs) == (32, 10, 50)


@pytest.mark.parametrize("link", ["out", "out/checkpoints", "out/metrics.jsonl"])
def test_a_link_as_the_output_folder_or_its_checkpoints_is_refused_naming_it_before_any_work(
        tmp_path, monkeypatch, link):
    from lmforge.utils.atomic import UnsafePath

    (tmp_path / "elsewhere").mkdir()  # metrics.jsonl: a link to a folder or a file, refused alike
    if link != "out":
        (tmp_path / "out").mkdir()
    (tmp_path / link).symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    monkeypatch.setattr(pretrain_module, "_corpus", lambda *a, **k: pytest.fail("work began before refusing"))
    for resume in (False, True):
        with pytest.raises(UnsafePath, match=f"^{tmp_path / link}: is a symbolic link"):
            pretrain("mlm", tmp_path / "out", TrainConfig(steps=1), preset="bert-tiny", overrides=TINY,
                     resume=resume)
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("name, said", [("", "^out is empty: name the output folder"),
                                        ("afile", "afile: exists and is not a folder")])
def test_an_empty_output_name_or_a_file_is_refused_before_any_work(tmp_path, monkeypatch, name, said):
    from lmforge.utils.atomic import UnsafePath

    (tmp_path / "afile").write_text("the user's")
    monkeypatch.chdir(tmp_path)  # "" would be the working folder
    monkeypatch.setattr(pretrain_module, "_corpus", lambda *a, **k: pytest.fail("work began before refusing"))
    with pytest.raises(UnsafePath, match=said):
        pretrain("mlm", name, TrainConfig(steps=1), preset="bert-tiny", overrides=TINY)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


BAD_DISTILLATION = [({"alpha": -1}, "alpha"), ({"gamma": 1001}, "gamma"),
                    ({"temperature": 0.001}, "temperature"), ({"temperature": 1e4}, "temperature"),
                    ({"soft_on": "all"}, "soft_on"), ({"alpa": 1}, "alpa"), ({"beta": "2"}, "beta")]


@pytest.mark.parametrize("options, field", BAD_DISTILLATION)
def test_an_objective_option_out_of_its_range_is_refused_on_both_faces_naming_it(options, field, capsys,
                                                                                 tmp_path):
    """objective_options are checked by the objective (distillation: weights in [0, 1000], T in [0.01,
    1000], soft_on's choices) before the corpus, a tokenizer or a student is built."""
    import lmforge

    teacher = lmforge.build("bert-tiny", **TINY)
    with pytest.raises(OptionsError) as caught:
        pretrain("distillation", tmp_path / "p", TrainConfig(steps=1), teacher=teacher,
                 objective_options=options)
    assert caught.value.field == f"objective_options.{field}" and not (tmp_path / "p").exists()
    text = ", ".join(f"{k}: {v!r}" for k, v in options.items())
    err = refused_on_the_command_line(capsys, ["pretrain", "--objective", "distillation", "--teacher",
                                               "no-such-teacher", "--out", str(tmp_path / "c"),
                                               f"objective_options={{{text}}}"])
    assert f"objective_options.{field}" in err and not (tmp_path / "c").exists()


def test_objective_options_reach_the_objective_of_any_name(ran, tmp_path):
    """One mechanism for every objective: mlm's masking rate as distillation's loss weights."""
    assert main(cli(tmp_path / "o", "objective_options={rate: 0.2}")) == 0
    assert ran.calls[0][0].objective_options == {"rate": 0.2}
    with pytest.raises(OptionsError, match="objective_options.ratio"):
        pretrain("mlm", tmp_path / "p", TrainConfig(steps=1), preset="bert-tiny",
                 objective_options={"ratio": 2})


BAD_VALUES = [("mlm", "bert-tiny", "rate", 2), ("mlm", "bert-tiny", "replace", [0.5, 0.5, 0.5]),
              ("span", "bert-tiny", "p", 0), ("span", "bert-tiny", "max_words", 0),
              ("structural", "bert-tiny", "wso_rate", 1), ("rtd", "electra-small", "ratio", 1.5),
              ("rtd", "electra-small", "temperature", 0), ("replace-mlm", "electra-small", "gen_weight", -1),
              ("span-corruption", "t5-small", "noise_density", 1),
              ("span-corruption", "t5-small", "mean_noise_span_length", 0.5),
              ("denoising", "bart-base", "poisson_lambda", 0),
              ("denoising", "bart-base", "poisson_lambda", 1e-9),
              ("denoising", "bart-base", "infilling_ratio", 1),
              ("t5-bert-style", "t5-small", "rate", 1.5), ("plm", "xlnet-base", "K", 1),
              ("bilm", "elmo-medium", "samples", -1)]


@pytest.mark.parametrize("objective, preset, key, bad", BAD_VALUES, ids=lambda v: str(v))
def test_an_objective_value_out_of_its_range_is_refused_naming_it_before_any_work(
        objective, preset, key, bad, capsys, tmp_path, monkeypatch):
    """Each objective's bounds (Objective.bounds) are checked before the tokenizer or the corpus: a rate of
    2 had been refused by the constructor, after both, naming rate=2 rather than objective_options.rate."""
    monkeypatch.setattr(pretrain_module, "_corpus", lambda *a, **k: pytest.fail("work began before refusing"))
    with pytest.raises(OptionsError) as caught:
        pretrain(objective, tmp_path / "p", TrainConfig(steps=1), preset=preset, objective_options={key: bad})
    assert caught.value.field == f"objective_options.{key}" and "must be" in str(caught.value)
    assert not (tmp_path / "p").exists()
    args = ["pretrain", "--preset", preset, "--objective", objective, "--out", str(tmp_path / "c"),
            f"objective_options={{{key}: {bad!r}}}"]
    said = refused_on_the_command_line(capsys, args)
    assert f"objective_options.{key}: {key}=" in said and not (tmp_path / "c").exists()


GOOD_VALUES = [("mlm", "bert-base", {"rate": 0.3, "replace": [1.0, 0.0, 0.0]}),
               ("span", "bert-base", {"p": 1, "max_words": 1}),
               ("denoising", "bart-base", {"poisson_lambda": 0.5, "token_ratio": 0.0}),
               ("t5-bert-style", "t5-small", {"rate": 0.5}),
               ("rtd", "electra-small", {"ratio": 1, "temperature": 0.01, "disc_weight": 0}),
               ("plm", "xlnet-base", {"K": 2, "mem_len": 0}),
               ("plm", "xlnet-base", {"K": 6.5})]  # K is a ratio: the paper's 6 or 7, or between


@pytest.mark.parametrize("objective, preset, options", GOOD_VALUES, ids=lambda v: str(v))
def test_objective_values_within_their_bounds_pass_the_check_and_build(objective, preset, options):
    """Values at their bounds pass the early check and the constructor alike (the bound is one)."""
    from lmforge.objectives.keywords import check_keywords
    from lmforge.objectives.registry import get
    from tests.tasks.core import tiny, tokenizer

    spec = get(objective)
    check_keywords(spec, options, "objective_options")  # refuses nothing
    model = tiny(preset, decoder_start_token_id=0) if preset in ("bart-base", "t5-small") else tiny(preset)
    built = spec.build(model, tokenizer(spec.tokenizer), **{**spec.options, **options})
    assert isinstance(built, spec.build.__self__)


def test_span_masking_takes_no_whole_word_and_a_bounded_span(tmp_path):
    """SpanBERT masks whole words itself: whole_word was listed as its option and then a TypeError
    (given twice); max_words sizes its length table, so it is bounded by a sequence's length."""
    for options, field in (({"whole_word": False}, "objective_options.whole_word"),
                           ({"max_words": 10 ** 9}, "objective_options.max_words")):
        with pytest.raises(OptionsError) as refused:
            pretrain("span", tmp_path / "o", TrainConfig(steps=1), preset="bert-tiny",
                     objective_options=options)
        assert refused.value.field == field and not (tmp_path / "o").exists()


def test_read_options_without_text_files_are_refused_as_unread(capsys, tmp_path):
    """How data files are read, said where none are read (the built-in corpus, or shards, which record
    their own), is refused naming it rather than ignored."""
    from lmforge.data.read_options import ReadOptions

    err = refused_in_python(tmp_path / "o", read=ReadOptions(text_field="content"))
    assert err.field == "read" and "none are given" in str(err)
    err = refused_in_python(tmp_path / "o", read={"text_field": "content"})
    assert err.field == "read" and "must be a ReadOptions" in str(err)
    said = refused_on_the_command_line(capsys, cli(tmp_path / "o", "--text-field", "content"))
    assert said.endswith("--text-field says how --data files are read: give --data")


@pytest.mark.parametrize("data", [[1], [None], [["a.txt"]]])
def test_data_that_is_not_paths_is_refused_naming_data(tmp_path, data):
    """data=[1] had been taken, then failed as a TypeError traceback in the corpus reader."""
    err = refused_in_python(tmp_path / "o", data=data)
    assert err.field == "data" and "give paths" in str(err)


@pytest.mark.parametrize("field, most", [("overrides", MAX_OVERRIDES), ("data", MAX_DATA_PATHS),
                                         ("objective_options", MAX_OBJECTIVE_OPTIONS)])
def test_a_mapping_or_list_past_its_bound_is_refused_naming_it_before_its_keys_are_read(tmp_path, field,
                                                                                      most):
    """A client's dict or list is counted before any key is checked: 10**5 made-up keys were each judged."""
    n = most + 1
    given = [f"f{i}.txt" for i in range(n)] if field == "data" else {f"k{i}": 1 for i in range(n)}
    err = refused_in_python(tmp_path / "o", **{field: given})
    assert err.field == field and f"must hold at most {most} entries, got {n}" in str(err)
    fine = given[:most] if field == "data" else dict(list(given.items())[:most])
    with pytest.raises((OptionsError, OSError)) as caught:  # within the bound: the keys (paths) are judged
        pretrain("mlm", tmp_path / "o", TrainConfig(steps=1), preset="bert-tiny", **{field: fine})
    assert "at most" not in str(caught.value)


def test_objective_options_past_their_bound_are_refused_on_the_command_line_naming_them(capsys, tmp_path):
    options = "{" + ", ".join(f"k{i}: 1" for i in range(MAX_OBJECTIVE_OPTIONS + 1)) + "}"
    said = refused_on_the_command_line(capsys, cli(tmp_path / "o", f"objective_options={options}"))
    assert "objective_options must hold at most" in said and not (tmp_path / "o").exists()


def test_jsonl_data_without_the_text_field_is_refused_alike_on_both_faces_before_the_model(
        capsys, tmp_path, monkeypatch):
    """pretrain() read such a corpus after building the model, said two warnings, then an error; the command
    line refused it in one line before loading. Both now ask one check: the file, its records' fields and
    the field's name, before a model is built (a Python run given the field reads it)."""
    from lmforge.data.read_options import ReadOptions

    data = tmp_path / "c.jsonl"
    data.write_text('{"body": "the cat sat"}\n{"body": "the dog sat"}\n')
    said = f"{data}: no record has a string \"text\" field (its records' fields: body)"
    built = []

    def build(*args):  # where the model would be built: none is, the field being refused before
        built.append(args)
        raise RuntimeError("built")

    monkeypatch.setattr(pretrain_module, "_checked_config", build)
    err = refused_in_python(tmp_path / "o", data=[str(data)])
    assert err.field == "text_field" and str(err).startswith(said) and "text_field" in str(err)
    cli_said = refused_on_the_command_line(capsys, cli(tmp_path / "o", "--data", str(data)))
    assert f"--data {said}: give --text-field" in cli_said and not built
    with pytest.raises(RuntimeError, match="built"):  # the field named, the run goes on to build the model
        pretrain("mlm", tmp_path / "o", TrainConfig(steps=1), preset="bert-tiny", data=[str(data)],
                 read=ReadOptions(text_field="body"))
    assert len(built) == 1


def test_the_command_line_asks_pretrains_one_check_of_the_text_field_once(capsys, tmp_path, monkeypatch):
    """`lmforge pretrain --data` checked the field itself, then pretrain() checked it again: one request,
    one check (pretrain()'s), said on the command line naming --data and --text-field, exit status 2."""
    from lmforge.data import text_field

    data, asked = tmp_path / "c.jsonl", []
    data.write_text('{"body": "the cat sat"}\n')
    checked = text_field.missing_everywhere
    monkeypatch.setattr(text_field, "missing_everywhere", lambda *a: asked.append(a) or checked(*a))
    monkeypatch.setattr(pretrain_module, "_checked_config", lambda *a: pytest.fail("built before refusing"))
    said = refused_on_the_command_line(capsys, cli(tmp_path / "o", "--data", str(data)))
    assert said.endswith(f"error: --data {data}: no record has a string \"text\" field (its records' "
                         "fields: body): give --text-field, the field that holds the text")
    assert len(asked) == 1
    monkeypatch.setattr(pretrain_module, "_checked_config", lambda *a: asked.append("built") or 1 / 0)
    with pytest.raises(ZeroDivisionError):  # the field named: checked once, then the model is built
        main(cli(tmp_path / "o", "--data", str(data), "--text-field", "body"))
    assert len(asked) == 3 and asked[-1] == "built"


def test_a_no_text_field_error_copied_or_pickled_says_what_it_said():
    """NoTextField was rebuilt from its message as if that were `.missing`: a copy (or a worker's error,
    pickled) said the hint twice."""
    import copy
    import pickle

    from lmforge.data.text_field import NoTextField

    err = NoTextField("c.jsonl: no record has a string \"text\" field", "give it")
    for again in (copy.copy(err), pickle.loads(pickle.dumps(err))):
        assert (type(again), str(again), again.missing, again.field) == (NoTextField, str(err), err.missing,
                                                                         "text_field")
