"""A pretraining run's own tokenizer: kept for a resume, trained again for another corpus or settings."""
import pytest

from lmforge.data.synthetic import documents
from lmforge.train.tokenizer_run import default_tokenizer, run_tokenizer


def test_a_tokenizer_left_by_a_run_on_another_corpus_is_trained_again_not_taken(tmp_path):
    first, other = list(documents(40, seed=0)), [["zebra quartz fjord glyph", "vex nymph jinx sphinx"]] * 30
    kept = run_tokenizer(tmp_path, "bert", first, 300)  # a run killed before its first checkpoint
    assert run_tokenizer(tmp_path, "bert", first, 300).backend.get_vocab() == kept.backend.get_vocab()
    fresh = run_tokenizer(tmp_path, "bert", other, 300)  # a fresh run on other text in the same --out
    assert fresh.backend.get_vocab() == default_tokenizer("bert", other, 300).backend.get_vocab()
    assert "zebra" in fresh.backend.get_vocab() and "zebra" not in kept.backend.get_vocab()
    smaller = run_tokenizer(tmp_path, "bert", other, 120)  # other settings: trained again too
    assert len(smaller.backend.get_vocab()) <= 120
    (tmp_path / "tokenizer" / "tokenizer.json").unlink()  # deleted: trained again, not a load error
    assert run_tokenizer(tmp_path, "bert", other, 120).backend.get_vocab() == smaller.backend.get_vocab()


def test_another_rank_waits_for_this_corpus_tokenizer_not_a_stale_one(tmp_path, monkeypatch):
    run_tokenizer(tmp_path, "bert", documents(40, seed=0), 300)  # stale: rank 0 is replacing it
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(TimeoutError, match="rank 0 wrote no tokenizer"):
        run_tokenizer(tmp_path, "bert", documents(40, seed=1), 300, wait_s=0.3)


def test_a_tokenizer_saved_before_its_record_was_kept_is_the_runs_own(tmp_path):
    """A run folder from before trained_on.json: its tokenizer is the one its checkpoints were trained with,
    read as a resume always read it, never trained again (training may have changed since)."""
    docs = list(documents(30, seed=1))
    mine = default_tokenizer("bert", list(documents(30, seed=2)), 200)  # another text: another vocabulary
    mine.save(tmp_path / "tokenizer")
    got = run_tokenizer(tmp_path, "bert", docs, 200)
    retrained = default_tokenizer("bert", docs, 200)
    assert got.backend.get_vocab() == mine.backend.get_vocab() != retrained.backend.get_vocab()


def test_a_runs_tokenizer_whose_checksums_were_removed_is_refused_not_read_unverified(tmp_path):
    """A run's tokenizer kept its checksums (sha256.json) with its record (trained_on.json); with the
    checksums gone, a changed vocabulary entry was read unsaid (as a tokenizer from before checksums is)."""
    from lmforge.tokenizer import TokenizerError

    docs = list(documents(30, seed=1))
    run_tokenizer(tmp_path, "bert", docs, 200)
    folder = tmp_path / "tokenizer"
    (folder / "sha256.json").unlink()
    text = (folder / "tokenizer.json").read_text(encoding="utf-8")
    assert '"the":' in text
    (folder / "tokenizer.json").write_text(text.replace('"the":', '"thd":', 1), encoding="utf-8")
    with pytest.raises(TokenizerError) as refused:
        run_tokenizer(tmp_path, "bert", docs, 200)
    said = str(refused.value)
    assert "\n" not in said and str(folder / "sha256.json") in said and "missing" in said
