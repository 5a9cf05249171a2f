"""The retrieval jobs' options (retrieve reader, realm, ict, rag): each bound refused both ways, naming its
field; the command line refuses exactly what the object refuses, with its flag, in one line, status 2."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from lmforge.cli.retrieve import job_flags, job_options
from lmforge.config.options import OptionsError
from lmforge.retrieval.job_options import (IctOptions, IndexOptions, QueryOptions, RagOptions, ReaderOptions,
                                           RealmOptions)

CLASSES = (IndexOptions, QueryOptions, ReaderOptions, RealmOptions, IctOptions, RagOptions)

# (options class, field, a value below its bounds, one above, one inside)
BOUNDS = [(IndexOptions, "words", 0, 100_001, 1), (IndexOptions, "batch_size", 0, 65537, 65536),
          (QueryOptions, "k", 0, 1_000_001, 1), (QueryOptions, "candidates", 0, 1001, 1000),
          (ReaderOptions, "k", 0, 1001, 1000), (ReaderOptions, "negatives", 0, 101, 1),
          (ReaderOptions, "max_len", 15, 8193, 16), (RealmOptions, "k", -1, 1001, 0),
          (RealmOptions, "refresh_every", 0, 1_000_001, 1), (RealmOptions, "max_len", 7, 8193, 8192),
          (IctOptions, "keep", -0.01, 1.01, 1.0), (IctOptions, "rounds", 0, 1001, 1000),
          (RagOptions, "k", -1, 1001, 0), (RagOptions, "max_len", 15, 8193, 16),
          (RagOptions, "question_lr_scale", -0.01, 1.01, 0.0), (RagOptions, "num_beams", 0, 65, 64),
          (RagOptions, "max_new_tokens", 0, 4097, 4096)]


@pytest.mark.parametrize("cls, name, low, high, inside", BOUNDS)
def test_each_bound_is_refused_both_ways_naming_the_field(cls, name, low, high, inside):
    assert getattr(cls(**{name: inside}), name) == inside
    for bad in (low, high, "3", True):
        with pytest.raises(OptionsError, match=name) as err:
            cls(**{name: bad})
        assert err.value.field == name


def test_query_choices_and_candidates_at_least_k():
    assert QueryOptions(method="dense", backend="faiss").backend == "faiss"
    for name, bad in (("method", "sparse"), ("backend", "annoy")):
        with pytest.raises(OptionsError, match=name):
            QueryOptions(**{name: bad})
    assert QueryOptions(k=3, candidates=3).candidates == 3
    with pytest.raises(OptionsError, match=r"at least k \(4\)") as err:
        QueryOptions(k=4, candidates=3)
    assert err.value.field == "candidates"


def test_realm_needs_a_document_to_read():
    assert RealmOptions(k=0).null_document and RealmOptions(k=1, null_document=False).k == 1
    with pytest.raises(OptionsError, match="no document") as err:
        RealmOptions(k=0, null_document=False)
    assert err.value.field == "null_document"


def test_rag_decodes_within_generates_bounds_and_fast_only_for_rag_sequence():
    from lmforge.generate.options import GenerationOptions

    for name in ("num_beams", "max_new_tokens"):  # generate's bounds, not a copy of them
        ours, theirs = (c.__dataclass_fields__[name].metadata for c in (RagOptions, GenerationOptions))
        assert (ours["low"], ours["high"]) == (theirs["low"], theirs["high"])
    assert RagOptions(kind="sequence", decoding="fast", num_beams=4).decoding == "fast"
    with pytest.raises(OptionsError, match="Fast Decoding is RAG-Sequence's") as err:
        RagOptions(kind="token", decoding="fast")
    assert err.value.field == "decoding"
    with pytest.raises(OptionsError) as err:
        RagOptions(decoding="slow")
    assert err.value.field == "decoding"


def _parse(cls, argv: list):
    parser = argparse.ArgumentParser()
    job_flags(parser, cls)
    return job_options(parser.parse_args(argv), cls)


@pytest.mark.parametrize("cls, name, low, high, inside", BOUNDS)
def test_the_flags_accept_and_refuse_as_the_object_does(cls, name, low, high, inside):
    from lmforge.cli.common import UsageError

    flag = "--" + name.replace("_", "-")
    assert _parse(cls, [flag, str(inside)]) == cls(**{name: inside})
    for bad in (low, high):
        with pytest.raises(UsageError, match=f"^{flag} {bad}") as err:
            _parse(cls, [flag, str(bad)])
        assert "\n" not in str(err.value)


def test_switches_say_the_opposite_of_the_default():
    from lmforge.cli.common import UsageError

    assert _parse(RealmOptions, []) == RealmOptions()
    assert _parse(RealmOptions, ["--no-null-document"]).null_document is False
    assert _parse(IctOptions, ["--shared-encoder"]).separate is False
    with pytest.raises(UsageError, match="^--no-null-document: with --k 0 no document is left to read$"):
        _parse(RealmOptions, ["--k", "0", "--no-null-document"])


def test_every_option_has_a_flag_with_its_bounds_in_the_help():
    for cls in CLASSES:
        parser = argparse.ArgumentParser()
        job_flags(parser, cls)
        dests = {action.dest: action for action in parser._actions}
        for f in dataclasses.fields(cls):
            assert f.name in dests, (cls, f.name)
            if f.type != "bool" and getattr(cls(), f.name) is not None:
                assert f"default {getattr(cls(), f.name)}" in dests[f.name].help
            if f.metadata["high"] is not None:
                assert str(f.metadata["high"]) in dests[f.name].help.replace(",", "").replace("_", "")
            if f.metadata["choices"]:
                assert tuple(dests[f.name].choices) == f.metadata["choices"]


def test_the_jobs_take_only_their_own_options_object(tmp_path):
    from lmforge.retrieval import jobs
    from lmforge.train import TrainConfig

    cfg = TrainConfig()  # a TrainConfig itself, checked first (tests/test_job_arguments.py)
    for call in (lambda: jobs.run_ict("m", tmp_path, cfg, None, False),  # a flag where the options go
                 lambda: jobs.run_reader("m", tmp_path, cfg, options=RealmOptions()),
                 lambda: jobs.query_index(tmp_path, ["q"], {"k": 3})):
        with pytest.raises(OptionsError, match="options must be a"):
            call()
    with pytest.raises(OptionsError, match="need a model") as err:  # nothing would read them
        jobs.build_index_dir(tmp_path / "ix", None, None, words=50)
    assert err.value.field == "words"
    with pytest.raises(OptionsError, match="at most 1000") as err:  # the reranker's bound holds for k too
        jobs.query_index(tmp_path, ["q"], QueryOptions(k=1001), rerank=str(tmp_path))
    assert err.value.field == "k"


def test_query_flags_before_a_sub_command_are_refused(capsys):
    from lmforge.cli import main

    assert main(["retrieve", "--k", "3", "reader", "--out", "unused", "--model", "unused"]) == 2
    err = capsys.readouterr().err
    assert "--k: a query's flags" in err and err.count("\n") == 1


def test_a_setting_of_the_dense_search_is_refused_with_bm25_never_ignored(tmp_path, capsys):
    from lmforge.cli import main
    from lmforge.retrieval import jobs

    dense_only = "a backend of the dense search; method bm25"
    with pytest.raises(OptionsError, match=f"^backend=faiss: {dense_only}") as err:
        QueryOptions(method="bm25", backend="faiss")
    assert err.value.field == "backend" and QueryOptions(method="bm25").backend == "torch"
    with pytest.raises(OptionsError, match="^model=m: the dense search's query encoder; method") as err:
        jobs.query_index(tmp_path, ["q"], QueryOptions(method="bm25"), model="m")
    assert err.value.field == "model"
    with pytest.raises(OptionsError, match="^batch_size=8: passages embedded at once, for a dense") as err:
        jobs.build_index_dir(tmp_path / "ix", None, None, index=IndexOptions(batch_size=8))
    assert err.value.field == "batch_size" and not (tmp_path / "ix").exists()
    (tmp_path / "passages.jsonl").touch()  # an index, as far as the command looks before the options
    query = ["retrieve", "--index", str(tmp_path), "--query", "q", "--method", "bm25", "--backend", "faiss"]
    build = ["index", "build", "--out", str(tmp_path / "ix"), "--batch-size", "8"]
    for argv, said in ((query, f"--backend faiss: {dense_only}"), (build, "--batch-size 8: passages")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1 and not (tmp_path / "ix").exists()


def test_hard_negatives_are_bounded_in_python_as_on_the_command_line(tmp_path, capsys):
    from lmforge.cli import main
    from lmforge.retrieval.jobs import run_train
    from lmforge.retrieval.job_options import MAX_HARD_NEGATIVES
    from lmforge.train import TrainConfig

    for bad in (-1, MAX_HARD_NEGATIVES + 1, 10 ** 9, 2.5, True, "3"):  # unchecked in Python before
        with pytest.raises(OptionsError, match="^n_hard must be an integer") as err:
            run_train("m", tmp_path / "o", TrainConfig(steps=1), n_hard=bad)
        assert err.value.field == "n_hard" and not (tmp_path / "o").exists()
    with pytest.raises(SystemExit) as exit_:  # argparse's refusal of the flag
        main(["retrieve", "train", "--out", str(tmp_path / "o"), "--hard-negatives",
              str(MAX_HARD_NEGATIVES + 1)])
    assert exit_.value.code == 2
    said = f"--hard-negatives {MAX_HARD_NEGATIVES + 1}: must be in [0, {MAX_HARD_NEGATIVES}]"
    assert said in capsys.readouterr().err


def test_a_config_files_encoder_number_in_exponent_form_is_a_number(tmp_path):
    from lmforge.cli import build_parser
    from lmforge.cli.retrieve import _options

    config = tmp_path / "c.yaml"
    config.write_text("temperature: 5e-2\nlr: 1e-3\n")  # YAML 1.1 text: was refused here, read as lr
    argv = ["retrieve", "train", "--out", str(tmp_path / "o"), "--config", str(config)]
    args = build_parser().parse_args(argv)
    train, encoder = _options(args)
    assert encoder == {"temperature": 0.05} and train == {"lr": 1e-3}  # one YAML reader: numbers in both


def test_an_object_built_directly_reads_numpy_numbers_as_build_does():
    """QueryOptions(k=np.int64(3)) was refused as not an integer where a job's keyword (through coerce) took
    it: the object stores Python's number, frozen or not, and judges its bounds as before."""
    import numpy as np

    given = QueryOptions(k=np.int64(3), candidates=np.int32(4))
    assert given == QueryOptions(k=3, candidates=4) and type(given.k) is int and type(given.candidates) is int
    assert type(IctOptions(keep=np.float32(0.5)).keep) is float
    for bad in ({"k": np.int64(0)}, {"k": np.float64(2.5)}):
        with pytest.raises(OptionsError) as refused:
            QueryOptions(**bad)
        assert refused.value.field == "k"
