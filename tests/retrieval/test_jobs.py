"""The retrieval jobs' output folders: out/eval (the held-out recall's indexes) is made whole in a fresh
folder, so a link planted there is replaced and what it points to is never written; query_index reads its
queries as lmforge.embed reads texts."""
import json

import numpy as np
import pytest

import lmforge.retrieval.jobs as jobs
from lmforge.config.options import OptionsError
from lmforge.train import TrainConfig
from tests.retrieval.conftest import tiny_bert


def test_a_link_at_out_eval_is_replaced_never_written_through(tmp_path, monkeypatch):
    passages, sets = jobs.question_sets(None, None, 0)
    train, test = sets["train"][:8], sets["test"][:4]  # a few questions, their passages and a few more
    wanted = {i for r in train + test for i in r["positives"]}
    few = [p for p in passages if p.id in wanted] + [p for p in passages if p.id not in wanted][:8]
    monkeypatch.setattr(jobs, "question_sets", lambda *args: (few, {"train": train, "test": test}))
    model = tiny_bert(tmp_path / "model")
    out, target = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    target.mkdir()
    (out / "eval").symlink_to(target, target_is_directory=True)
    cfg = TrainConfig(steps=1, batch_size=4, warmup=0, progress=False, device="cpu")
    table = jobs.run_train(str(model), out, cfg, log=lambda m: None)
    assert set(table) == {"bm25", "untrained", "trained"} and list(target.iterdir()) == []
    assert not (out / "eval").is_symlink()
    written = sorted(p.name for p in (out / "eval").iterdir())
    assert written == ["index-trained", "index-untrained", "questions.json"]
    assert json.loads((out / "eval" / "questions.json").read_text())["seed"] == cfg.seed  # it drew the split


def test_every_retrieval_job_refuses_a_link_as_its_output_folder_before_any_work(tmp_path):
    from tests.links import link_checkpoints, refuse_the_link

    elsewhere, out, cfg = tmp_path / "elsewhere", tmp_path / "out", TrainConfig(steps=1)
    elsewhere.mkdir()
    out.symlink_to(elsewhere, target_is_directory=True)
    training = [lambda: jobs.run_train("missing", out, cfg), lambda: jobs.run_reader("missing", out, cfg),
                lambda: jobs.run_realm("missing", out, cfg), lambda: jobs.run_ict("missing", out, cfg)]
    refuse_the_link([lambda: jobs.build_index_dir(out, None), *training], out, elsewhere)
    refuse_the_link(training, link_checkpoints(out, elsewhere), elsewhere)  # before the models load
    assert [p.name for p in out.iterdir()] == ["checkpoints"] and not any(elsewhere.iterdir())  # none written


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory):
    """A BM25 index of the built-in passages."""
    from lmforge.retrieval.jobs import build_index_dir

    out = tmp_path_factory.mktemp("index") / "index"
    build_index_dir(out, None, progress=False)
    return out


def _searched(index, queries):
    from lmforge.retrieval.jobs import QueryOptions, query_index

    return query_index(index, queries, QueryOptions(method="bm25", k=3))


def test_one_query_text_is_one_query_and_a_generator_of_them_is_their_list(bm25_index):
    # a text was searched a character at a time; a generator was used up by the search, then answered []
    want = _searched(bm25_index, ["where was Dreatou born"])
    assert _searched(bm25_index, "where was Dreatou born") == want and len(want) == 1
    assert _searched(bm25_index, (q for q in ["where was Dreatou born"])) == want
    with pytest.raises(OptionsError, match="^queries must be a text or a non-empty list"):
        _searched(bm25_index, [])  # as every face refuses an empty request (a ValueError inside the search)


@pytest.mark.parametrize("queries", [None, 3, ["who", 3], {"who": 1}, b"who", ["who", " "], ""])
def test_queries_that_are_not_texts_are_refused_naming_queries(bm25_index, queries):
    with pytest.raises(OptionsError) as refused:  # were TypeError / AttributeError from the BM25 tokenizer
        _searched(bm25_index, queries)
    assert refused.value.field == "queries" and "\n" not in str(refused.value)


@pytest.mark.parametrize("seed", [True, -1, 2.5, 2 ** 63, "1", np.int64(-1)])
def test_build_index_dir_takes_the_seeds_index_build_seed_takes(tmp_path, seed):
    # True was read as 1 and -1 passed (--seed refuses both): each is now refused in one line, as a seed
    # given to any other job's Python face
    from lmforge.config.options import OptionsError
    from lmforge.retrieval.jobs import build_index_dir

    with pytest.raises(OptionsError) as refused:
        build_index_dir(tmp_path / "out", None, seed=seed, progress=False)
    assert refused.value.field == "seed" and not (tmp_path / "out").exists()


def test_a_numpy_seed_reads_as_python_s_int_as_trainconfigs_seed_does(tmp_path):
    """np.int64(1) failed inside random.Random, then was refused, where TrainConfig(seed=...) takes it as 1:
    it now draws the passages seed 1 draws."""
    from lmforge.retrieval.jobs import build_index_dir

    build_index_dir(tmp_path / "a", None, seed=np.int64(1), progress=False)
    build_index_dir(tmp_path / "b", None, seed=1, progress=False)
    assert (tmp_path / "a/passages.jsonl").read_bytes() == (tmp_path / "b/passages.jsonl").read_bytes()


def test_a_whole_float_k_reads_as_its_int_built_directly_or_not():
    """QueryOptions(k=3.0) was refused where every other options object (and QueryOptions.build) took it."""
    from lmforge.retrieval.job_options import QueryOptions

    assert QueryOptions(k=3.0).k == 3 and type(QueryOptions(k=3.0).k) is int
    with pytest.raises(OptionsError, match="^k must be an integer"):
        QueryOptions(k=3.5)


@pytest.mark.parametrize("out, source", [("corpus", "corpus"), ("corpus/ix", "corpus"),
                                         ("ix", "ix/passages.jsonl")])
def test_build_index_dir_refuses_an_out_over_or_inside_its_input_as_the_command_does(tmp_path, out, source):
    from lmforge.cli import main
    from lmforge.utils.atomic import UnsafePath

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("The Tedar river runs past Kusais. Kusais is a city.\n")
    jobs.build_index_dir(tmp_path / "ix", tmp_path / "corpus", progress=False)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(UnsafePath, match="the input source") as err:
        jobs.build_index_dir(tmp_path / out, str(tmp_path / source), progress=False)
    assert err.value.field == "out"
    assert main(["index", "build", "--out", str(tmp_path / out), "--passages", str(tmp_path / source)]) == 2
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing written


def test_words_for_a_passages_file_is_refused_not_ignored(bm25_index, tmp_path):
    from lmforge.retrieval.job_options import IndexOptions

    with pytest.raises(OptionsError, match="passages file") as err:
        jobs.build_index_dir(tmp_path / "again", str(bm25_index / "passages.jsonl"),
                             index=IndexOptions(words=5), progress=False)
    assert err.value.field == "words" and not (tmp_path / "again").exists()
    summary = jobs.build_index_dir(tmp_path / "again", str(bm25_index / "passages.jsonl"), progress=False)
    assert summary["passages"] == len((bm25_index / "passages.jsonl").read_text().splitlines())


def test_the_number_and_length_of_queries_are_bounded_naming_queries(bm25_index, capsys):
    from lmforge.cli import main
    from lmforge.retrieval.job_options import MAX_QUERIES, MAX_QUERY_CHARS

    for queries, says in ((["river"] * (MAX_QUERIES + 1), "at most"),
                          (["river " * MAX_QUERY_CHARS], "characters")):
        with pytest.raises(OptionsError, match=says) as err:
            _searched(bm25_index, queries)
        assert err.value.field == "queries"
    long = "x" * (MAX_QUERY_CHARS + 1)
    assert main(["retrieve", "--index", str(bm25_index), "--method", "bm25", "--query", long]) == 2
    assert "characters" in capsys.readouterr().err
    assert len(_searched(bm25_index, ["river"] * 2)) == 2


def test_every_training_job_refuses_an_out_that_is_its_model_before_any_work(tmp_path):
    from lmforge.utils.atomic import UnsafePath

    model, cfg = tmp_path / "model", TrainConfig(steps=1)
    model.mkdir()
    (model / "config.json").write_text("{}")  # never read: the refusal comes first
    runs = [lambda out: jobs.run_train(str(model), out, cfg),
            lambda out: jobs.run_reader(str(model), out, cfg),
            lambda out: jobs.run_realm(str(model), out, cfg), lambda out: jobs.run_ict(str(model), out, cfg),
            lambda out: jobs.run_reader("m", out, cfg, retriever=str(model))]
    for run in runs:
        for out in (model, tmp_path):  # is it, holds it
            with pytest.raises(UnsafePath, match="the input") as err:
                run(out)
            assert err.value.field == "out"
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_run_refuses_what_the_command_refuses_a_model_file_and_a_hard_linked_metrics(tmp_path):
    """The command's rule (utils.atomic.writes_over): an out named as a file of the model folder, or whose
    metrics.jsonl (appended to) is a hard link to the questions, is refused before any work."""
    import os

    from lmforge.utils.atomic import UnsafePath

    model, cfg = tmp_path / "model", TrainConfig(steps=1)
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "q.jsonl").write_text("{}")
    (tmp_path / "out").mkdir()
    os.link(tmp_path / "q.jsonl", tmp_path / "out" / "metrics.jsonl")
    for out, questions in ((model / "vocab.txt", None), (tmp_path / "out", str(tmp_path / "q.jsonl"))):
        with pytest.raises(UnsafePath, match="the input") as err:
            jobs.run_train(str(model), out, cfg, questions=questions)
        assert err.value.field == "out"
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]


def test_a_reader_reads_at_most_max_read_passages_a_query_both_faces(bm25_index, capsys):
    from lmforge.cli import main
    from lmforge.retrieval.jobs import QueryOptions, query_index
    from lmforge.retrieval.job_options import MAX_READ, ReaderOptions

    with pytest.raises(OptionsError, match="a reader reads at most") as err:  # before the reader is loaded
        query_index(bm25_index, "river", QueryOptions(k=MAX_READ + 1, method="bm25"), reader="never-read")
    assert err.value.field == "k" and ReaderOptions(k=MAX_READ).k == MAX_READ
    assert main(["retrieve", "--index", str(bm25_index), "--query", "river", "--method", "bm25", "--k",
                 str(MAX_READ + 1), "--reader", "never-read"]) == 2
    assert "a reader reads at most" in capsys.readouterr().err


def test_the_readers_training_rankings_are_deep_enough_for_its_negatives(tmp_path, monkeypatch):
    from lmforge.retrieval.job_options import ReaderOptions

    model, depths = tiny_bert(tmp_path / "model"), []

    def rankings(passages, records, out, retriever=None, k=20):
        depths.append(k)
        raise RuntimeError("stop here")

    monkeypatch.setattr(jobs, "rankings", rankings)
    with pytest.raises(RuntimeError, match="stop here"):
        jobs.run_reader(str(model), tmp_path / "out", TrainConfig(steps=1),
                        options=ReaderOptions(negatives=30, max_len=64))
    assert depths == [60]  # a depth of 20 gave no question 30 negatives: nothing to train on


def test_a_dense_build_says_how_many_passages_it_cut_to_max_length(tmp_path):
    """Passages longer than max_length are embedded from their first tokens: the summary counts them
    (none at the model's 64 positions for 10-word windows, every one at 8 tokens)."""
    model = tiny_bert(tmp_path / "model")
    few = jobs.build_index_dir(tmp_path / "a", None, str(model), index=jobs.IndexOptions(words=10),
                               progress=False)
    cut = jobs.build_index_dir(tmp_path / "b", None, str(model), index=jobs.IndexOptions(words=10),
                               progress=False, max_length=8)
    assert few["cut"] == 0 < cut["cut"] == cut["passages"] == few["passages"]


def test_a_temperature_with_normalize_false_is_refused_naming_it_not_ignored(tmp_path):
    model = tiny_bert(tmp_path / "m")
    with pytest.raises(OptionsError, match="temperature=0.1") as err:  # raw inner products: never divided
        jobs.run_train(str(model), tmp_path / "out", TrainConfig(steps=1), normalize=False, temperature=0.1)
    assert err.value.field == "temperature" and not (tmp_path / "out" / "final").exists()


@pytest.mark.parametrize("field, value", [("temperature", 0.2), ("matryoshka_dims", [16, 8])])
def test_an_index_build_refuses_a_setting_of_the_training_loss(tmp_path, capsys, field, value):
    """`index build temperature=0.2` was taken and ignored: an index embeds, never trains."""
    from lmforge.cli import main

    model = tiny_bert(tmp_path / "m")
    with pytest.raises(OptionsError, match=f"^{field}: a setting of the training loss") as err:
        jobs.build_index_dir(tmp_path / "out", None, str(model), progress=False, **{field: value})
    assert err.value.field == field and not (tmp_path / "out").exists()
    text = f"{field}={value}".replace(" ", "")
    args = ["index", "build", "--passages", "builtin", "--model", str(model), "--out", str(tmp_path / "o")]
    assert main([*args, text]) == 2
    assert f"{field}: a setting of the training loss" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("resume", [False, True])
@pytest.mark.parametrize("job", ["run_train", "run_reader", "run_realm", "run_ict"])
def test_every_training_job_refuses_an_out_holding_a_run_s_checkpoints_before_the_model_is_read(tmp_path, job,
                                                                                                resume):
    """A run not resumed on an out holding a run's checkpoints was refused only by Trainer.fit, once the
    model and the data were read (here the missing model was the error said); a resume gets past it."""
    from lmforge.utils.atomic import UnsafePath

    out, model = tmp_path / "run", str(tmp_path / "missing")
    (out / "checkpoints" / "step-0000002").mkdir(parents=True)
    with pytest.raises(Exception) as err:
        getattr(jobs, job)(model, out, TrainConfig(steps=1), resume=resume)
    if resume:  # past the check: the model is read, and found missing
        assert not isinstance(err.value, UnsafePath) and f"{model} is neither a model" in str(err.value)
    else:
        assert isinstance(err.value, UnsafePath) and err.value.field == "out"
        assert str(err.value) == (f"out {out} already holds a run's checkpoints: pass resume=True (--resume) "
                                  "to continue it, or another folder")


def test_gcide_beside_passages_and_passages_of_one_title_name_the_python_fields(tmp_path):
    """question_sets and split_by_title said "--questions gcide ... drop --passages" and "--passages: ...",
    flags a Python caller (run_train, run_realm: passages_source=) never gave: the fields, and the flags."""
    from lmforge.retrieval.passages import Passage

    with pytest.raises(OptionsError) as gcide:
        jobs.question_sets("gcide", "passages.jsonl", 0)
    assert "drop passages_source (--passages)" in str(gcide.value) and gcide.value.field == "passages_source"
    one = [Passage(str(i), "One title", f"text {i}") for i in range(3)]
    with pytest.raises(OptionsError) as titles:
        jobs.split_by_title(one, 0.1, 0)
    assert str(titles.value).startswith("passages_source (--passages): 1 document title(s)")
    assert titles.value.field == "passages_source"
