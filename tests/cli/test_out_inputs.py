"""No command writes over one of its inputs: an input given inside --out, at a name the job writes there,
is refused up front in one line naming both flags (exit 2), and the input is left as it was."""
import pytest

from tests.faces import cli_verdict

# (argv before the input flag, the input flag, the name under --out it is given as)
CASES = [
    (["heads", "--model", "m", "--data", "d.jsonl"], "--importance-data", "heads.json"),
    (["prune", "--model", "m", "--method", "ffn", "--sparsity", "0.5", "--data", "d.jsonl"],
     "--importance-data", "prune.json"),
    (["prune", "--model", "m", "--method", "magnitude", "--sparsity", "0.5", "--data", "d.jsonl"],
     "--train", "prune_settings.json"),  # the settings a --resume checks
    (["probe", "--model", "m"], "--config", "probe.json"),
    (["probe", "--model", "m"], "--tokenizer", "."),
    (["features", "--model", "m", "--text", "a b"], "--config", "metrics.json"),
    (["features", "--model", "m", "--text", "a b"], "--tokenizer", "."),
    (["features", "--model", "m", "--text", "a b"], "--train", "features.safetensors"),
    (["quantize", "--model", "{model}"], "--calibration", "quantize.json"),
    (["retrieve", "train", "--steps", "1"], "--model", "final"),
    (["retrieve", "reader", "--steps", "1"], "--model", "final"),
    (["retrieve", "reader", "--steps", "1"], "--retriever", "index"),  # the run's dense index of passages
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A saved tiny model (a command that finds its model before it checks --out needs one on disk)."""
    import lmforge

    path = tmp_path_factory.mktemp("model") / "m"
    lmforge.build(lmforge.tiny("bert-base")).save(path)
    return path


@pytest.mark.parametrize("argv, flag, name", CASES,
                         ids=[f"{' '.join(a[:2] if a[1][0] != '-' else a[:1])} {f}" for a, f, _ in CASES])
def test_an_input_at_a_name_the_job_writes_is_refused(tmp_path, monkeypatch, model, argv, flag, name):
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{model}", str(model)) for a in argv]
    out = tmp_path / "o"
    out.mkdir()
    given = out / name
    if name in ("final", "index"):  # a model folder
        given.mkdir()
        (given / "config.json").write_text("{}\n")
    elif name != ".":
        given.write_text("{}\n")
    before = sorted(p.name for p in out.iterdir())
    line = cli_verdict([*argv, flag, str(given), "--out", str(out)], {})
    assert line is not None and f"--out {out} " in line and f"the input {flag} {given}: " in line, line
    assert sorted(p.name for p in out.iterdir()) == before  # nothing written
    if name not in (".", "final", "index"):
        assert given.read_text() == "{}\n"


@pytest.mark.parametrize("argv", [["index", "build"], ["retrieve", "train", "--steps", "1"]], ids=" ".join)
def test_an_out_inside_the_passages_folder_is_refused(tmp_path, argv):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat .\n")
    line = cli_verdict([*argv, "--passages", str(corpus), "--out", str(corpus / "run")], {})
    said = f"--out {corpus / 'run'} lies inside the input --passages {corpus}: "
    assert line is not None and said in line, line
    assert [p.name for p in corpus.iterdir()] == ["a.txt"]  # a later run would read OUT's files as text


# (argv before --out, the input file's flag, the name under --out a hard link of it is planted at)
LINKED = [
    (["heads", "--model", "{model}", "--task", "cls"], "--data", "heads.json"),
    (["prune", "--model", "{model}", "--method", "ffn", "--sparsity", "0.5"], "--data", "prune.json"),
    (["distill", "--teacher", "{model}", "--train", "t.jsonl"], "--data", "distill.json"),
    (["quantize", "--model", "{model}"], "--data", "quantize.json"),
]


@pytest.mark.parametrize("argv, flag, name", LINKED, ids=[a[0] for a, _, _ in LINKED])
def test_a_hard_link_of_an_input_at_a_written_name_is_refused(tmp_path, monkeypatch, model, argv, flag, name):
    """OUT/<report> a hard link of --data: writing the report would change the data (another name of
    one file, which a comparison of resolved paths does not see)."""
    import os

    monkeypatch.chdir(tmp_path)
    data, out = tmp_path / "d.jsonl", tmp_path / "o"
    data.write_text("{}\n")
    out.mkdir()
    os.link(data, out / name)
    argv = [a.replace("{model}", str(model)) for a in argv]
    line = cli_verdict([*argv, flag, str(data), "--out", str(out)], {})
    assert line is not None and f"--out {out} holds the input {flag} {data}: " in line, line
    assert data.read_text() == "{}\n" and [p.name for p in out.iterdir()] == [name]


# (argv before --out, the name under --out the job writes a model folder to)
MODEL_AT = [
    (["heads", "--model", "{model}", "--data", "d.jsonl", "--task", "cls"], "pruned"),
    (["prune", "--model", "{model}", "--method", "ffn", "--sparsity", "0.5", "--data", "d.jsonl"], "model"),
    (["distill", "--teacher", "{model}", "--train", "t.jsonl", "--data", "d.jsonl"], "final"),
    (["quantize", "--model", "{model}"], "model"),
]


@pytest.mark.parametrize("argv, name", MODEL_AT, ids=[a[0] for a, _ in MODEL_AT])
def test_a_written_name_linked_to_the_source_model_is_refused(tmp_path, monkeypatch, model, argv, name):
    """OUT/model a symbolic link to --model: the job's names are judged as written (utils.atomic.writes_over),
    in one line naming the source, before any work."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "o"
    out.mkdir()
    (out / name).symlink_to(model, target_is_directory=True)
    before = sorted(p.name for p in model.iterdir())
    line = cli_verdict([*(a.replace("{model}", str(model)) for a in argv), "--out", str(out)], {})
    flag = "--teacher" if argv[0] == "distill" else "--model"
    assert line is not None and f"--out {out} holds the input {flag} {model}: " in line, line
    assert sorted(p.name for p in model.iterdir()) == before and (out / name).is_symlink()


# a job's command (argv before --out) and how an out that meets its --model meets it
SAME_JOB = {
    "quantize": (["quantize", "--model", "{model}"], "holds"),
    "retrieve ict": (["retrieve", "ict", "--model", "{model}", "--steps", "1"], "is"),
}


@pytest.mark.parametrize("job", SAME_JOB)
def test_one_overlap_is_refused_in_one_wording_by_the_command_and_by_python(model, job):
    """The command line and its Python job (run_quantize, run_ict) refuse the same out by one function
    (utils.apart), in one wording: the command's line is Python's message with the flags for the fields."""
    from lmforge.compress.quantize_report import run_quantize
    from lmforge.retrieval.jobs import run_ict
    from lmforge.train import TrainConfig
    from lmforge.utils.apart import WHY
    from lmforge.utils.atomic import UnsafePath

    argv, relation = SAME_JOB[job]
    out = model.parent if relation == "holds" else model
    before = sorted(p.name for p in model.parent.rglob("*"))

    def words(out_name: str, model_name: str) -> str:
        return (f"{out_name} {out} {relation} the input {model_name} {model}: {WHY[relation]}; "
                f"choose another {out_name}")

    line = cli_verdict([*(a.replace("{model}", str(model)) for a in argv), "--out", str(out)], {})
    assert line == f"lmforge {job}: error: {words('--out', '--model')}\n"
    with pytest.raises(UnsafePath) as err:
        run_quantize(model, out) if job == "quantize" else run_ict(str(model), out, TrainConfig(steps=1))
    assert str(err.value) == words("out", "model") and err.value.field == "out"
    assert sorted(p.name for p in model.parent.rglob("*")) == before  # nothing written by either


@pytest.mark.parametrize("argv", [["retrieve", "ict", "--steps", "1"], ["index", "build"]])
def test_an_out_holding_a_retrieval_input_is_refused_naming_the_flags(tmp_path, argv):
    """A retrieval job's out may hold none of its inputs (a later run would read them back): the command let
    such an --out through to its Python job, whose line named "out" and "model", no flag the command has."""
    import lmforge

    model, passages = tmp_path / "run" / "enc", tmp_path / "p.txt"
    lmforge.build(lmforge.tiny("bert-base")).save(model)
    passages.write_text("the cat sat on the mat .\n")
    out = tmp_path / "run"
    line = cli_verdict([*argv, "--model", str(model), "--passages", str(passages), "--out", str(out)], {})
    assert line is not None and f": error: --out {out} holds the input --model {model}: " in line, line
    assert sorted(p.name for p in out.iterdir()) == ["enc"]  # nothing written


def test_refuse_nested_reads_the_inputs_on_disk_by_the_rule_jobs_use(tmp_path, monkeypatch):
    """An empty name is nothing on disk (utils.apart.on_disk), not the working folder that holds --out: it
    was read as Path(""), which exists; a real folder holding --out is still refused."""
    from lmforge.cli.common import UsageError, refuse_nested

    monkeypatch.chdir(tmp_path)
    refuse_nested("out", ("--data", ""), ("--passages", ["", "missing.txt"]))
    (tmp_path / "corpus").mkdir()
    with pytest.raises(UsageError, match="lies inside the input folder --data corpus"):
        refuse_nested("corpus/out", ("--data", ["", "corpus"]))


@pytest.mark.parametrize("argv", [["index", "build"], ["retrieve", "train", "--steps", "1"],
                                  ["retrieve", "reader", "--steps", "1"]], ids=" ".join)
def test_an_out_inside_a_retrieval_model_folder_is_refused_in_the_flags_words(tmp_path, argv):
    """--model M --out M/ix: a retrieval job reads a model folder whole (a retriever's passage/), so its
    Python job refused it, naming "out" and "model", no flag the command has; the command's check (a model
    folder read by its model files) let it through. Now the command refuses it first, in the job's wording
    with the flags, and nothing is written."""
    import lmforge
    from lmforge.retrieval.jobs import build_index_dir
    from lmforge.utils.apart import WHY
    from lmforge.utils.atomic import UnsafePath

    model = tmp_path / "enc"
    lmforge.build(lmforge.tiny("bert-base")).save(model)
    out, before = model / "ix", sorted(p.name for p in model.iterdir())

    def words(out_name: str, model_name: str) -> str:
        return (f"{out_name} {out} lies inside the input {model_name} {model}: {WHY['lies inside']}; "
                f"choose another {out_name}")

    line = cli_verdict([*argv, "--model", str(model), "--out", str(out)], {})
    assert line == f"lmforge {' '.join(argv[:2])}: error: {words('--out', '--model')}\n", line
    with pytest.raises(UnsafePath) as err:
        build_index_dir(out, None, str(model))
    assert str(err.value) == words("out", "model")
    assert sorted(p.name for p in model.iterdir()) == before  # nothing written
