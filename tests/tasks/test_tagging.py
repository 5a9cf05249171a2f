"""Token classification: CoNLL reading, BIO tags on sub-words, entity-level scores, a tiny fine-tune."""
from __future__ import annotations

import pytest
import torch

import lmforge
from lmforge.config.options import OptionsError
from lmforge.data.probes import tasks
from lmforge.io import find_model_dir
from lmforge.objectives.base import IGNORE
from lmforge.tasks import task_class
from lmforge.tasks.tagging import (TaggingTask, align, entity_scores, is_chunked, read_conll, tag_scores,
                                   tag_set, word_tags)
from lmforge.tokenizer import train_tokenizer

LABELS = ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]
SENTENCE = (["Goukapaith", "Bivibrath", "visited", "New", "Unaffablehampton", "."],
            ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"])


@pytest.fixture(scope="module")
def minilm():
    """all-MiniLM-L6-v2's WordPiece vocabulary (uncased BERT's)."""
    return lmforge.load_tokenizer(find_model_dir("all-MiniLM-L6-v2"))


@pytest.fixture(scope="module")
def builtin():
    """The built-in tagging task and a WordPiece tokenizer trained on its sentences (small vocab: names
    split into several pieces)."""
    data = tasks(300, seed=0)["tagging"]
    texts = [" ".join(r["words"]) for r in data["train"]]
    return data, train_tokenizer(texts, "wordpiece", 120)


def tiny_tagger(tokenizer, labels, seed=0, **kw):
    torch.manual_seed(seed)
    model = lmforge.build(lmforge.tiny("bert-base"), vocab_size=tokenizer.vocab_size, max_seq_len=64)
    return TaggingTask(model, tokenizer, labels, **kw)


# ---- reading CoNLL ----------------------------------------------------------------------------------

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC


Peter NNP B-NP B-PER
Blackburn NNP B-NP I-PER
"""


def test_read_conll_sentences_tags_and_line_numbers(tmp_path):
    path = tmp_path / "train.conll"
    path.write_text(CONLL, encoding="utf-8")
    records = read_conll(path)
    assert records == [{"words": ["EU", "rejects", "German"], "tags": ["B-ORG", "O", "B-MISC"], "line": 3},
                       {"words": ["Peter", "Blackburn"], "tags": ["B-PER", "I-PER"], "line": 8}]
    assert [r["tags"] for r in read_conll(path, tag_column=1)] == [["NNP", "VBZ", "JJ"], ["NNP", "NNP"]]
    assert tag_set(records) == ["B-MISC", "B-ORG", "B-PER", "I-PER", "O"]


@pytest.mark.parametrize("text, message", [
    ("EU B-ORG\nrejects\n", "line 2: 'rejects' has a word but no tag column"),
    ("EU NNP B-ORG\n\nPeter B-PER\n",
     "line 3: 2 columns 'Peter B-PER', but the word is column 0 and the tag column 2"),
    ("\n\n-DOCSTART- O\n", "no sentences"),
])
def test_read_conll_errors_name_the_line(tmp_path, text, message):
    path = tmp_path / "bad.conll"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(OptionsError, match=message.replace(".", r"\.")) as err:
        read_conll(path, tag_column=2 if "column 2" in message else -1)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)
    assert err.value.field is None  # the file's fault: its message names it and the line


def test_read_conll_refuses_other_encodings_with_the_line(tmp_path):
    path = tmp_path / "latin1.conll"
    path.write_bytes("EU B-ORG\n\nZürich B-LOC\n".encode("latin-1"))
    with pytest.raises(OptionsError, match=rf"^{path}: line 3: not valid UTF-8 \(byte 0xfc\)") as err:
        read_conll(path)
    assert err.value.field is None


# ---- sub-word alignment -------------------------------------------------------------------------------


def _check_first_piece_labels(tokenizer, words, tags, example, label_all=False):
    """Every word's first piece carries its tag, other pieces IGNORE (or I-X under label_all)."""
    ids, word_ids, labels = example["input_ids"], example["word_ids"], example["labels"]
    assert len(ids) == len(word_ids) == len(labels)
    seen = set()
    for k, (w, label) in enumerate(zip(word_ids, labels)):
        if w < 0:
            assert label == IGNORE and ids[k] in (tokenizer.cls_id, tokenizer.sep_id)
        elif w not in seen:
            seen.add(w)
            assert LABELS[label] == tags[w]
        elif label_all:
            assert LABELS[label] == tags[w].replace("B-", "I-")
        else:
            assert label == IGNORE
    assert seen == set(range(len(words)))
    # the pieces of each word spell it (## continuations)
    for w, word in enumerate(words):
        pieces = [tokenizer.id_to_token(i) for i, x in zip(ids, word_ids) if x == w]
        assert "".join(p.removeprefix("##") for p in pieces) == word.lower()


def test_labels_align_with_minilm_wordpieces(minilm):
    words, tags = SENTENCE
    example = align(minilm, words, tags, LABELS, max_len=64)
    split = [w for w in range(len(words)) if example["word_ids"].count(w) > 1]
    assert 0 in split and 4 in split  # names split into several pieces
    _check_first_piece_labels(minilm, words, tags, example)
    _check_first_piece_labels(minilm, words, tags, align(minilm, words, tags, LABELS, 64, label_all=True),
                              label_all=True)
    # reading the predictions back at the first pieces gives one tag per word
    assert word_tags(example["word_ids"], [max(x, 0) for x in example["labels"]], LABELS, len(words)) == tags


def test_labels_align_with_a_trained_wordpiece_tokenizer(builtin):
    data, tok = builtin
    n_split = 0
    for record in data["validation"][:20]:
        example = align(tok, record["words"], record["tags"], tag_set(data["train"]), max_len=64)
        ids, word_ids = example["input_ids"], example["word_ids"]
        n_split += sum(word_ids.count(w) > 1 for w in range(len(record["words"])))
        first = [k for k, w in enumerate(word_ids) if w >= 0 and w != word_ids[k - 1]]
        assert [w for w in word_ids if w >= 0] == sorted(w for w in word_ids if w >= 0)
        labels = tag_set(data["train"])
        assert [example["labels"][k] for k in first] == [labels.index(t) for t in record["tags"]]
        assert sum(x != IGNORE for x in example["labels"]) == len(record["words"])
        for w, word in enumerate(record["words"]):  # the pieces of each word spell it
            pieces = [tok.id_to_token(i) for i, x in zip(ids, word_ids) if x == w]
            assert "".join(p.removeprefix("##") for p in pieces) == word
    assert n_split > 10


@pytest.mark.parametrize("kind", ["bytelevel-bpe", "unigram"])
def test_labels_align_with_leading_space_pieces(builtin, kind):
    """Byte-level BPE (Ġ) and unigram (▁) pieces carry the space before a word: still that word's."""
    data, _ = builtin
    tok = train_tokenizer([" ".join(r["words"]) for r in data["train"]], kind, 300)
    labels = tag_set(data["train"])
    for record in data["validation"][:10]:
        example = align(tok, record["words"], record["tags"], labels, max_len=64)
        word_ids = example["word_ids"]
        assert sorted(set(word_ids) - {-1}) == list(range(len(record["words"])))
        for w, word in enumerate(record["words"]):
            pieces = [k for k, x in enumerate(word_ids) if x == w]
            assert pieces == list(range(pieces[0], pieces[-1] + 1))  # a word's pieces are contiguous
            assert example["labels"][pieces[0]] == labels.index(record["tags"][w])
            assert tok.decode([example["input_ids"][k] for k in pieces]).strip() == word


def test_truncation_keeps_specials_and_tags_cut_words_none(minilm):
    """A word past the cut was not read: None, not a prediction of "O" a caller could not tell apart."""
    words, tags = SENTENCE
    # [CLS] go ##uka ##pa ##ith bi ##vi [SEP]: the second word is cut inside, the rest are gone
    example = align(minilm, words, tags, LABELS, max_len=8)
    assert len(example["input_ids"]) == 8 and example["input_ids"][-1] == minilm.sep_id
    assert example["word_ids"] == [-1, 0, 0, 0, 0, 1, 1, -1]
    predicted = [LABELS.index("B-LOC")] * 8
    assert word_tags(example["word_ids"], predicted, LABELS, len(words)) == ["B-LOC"] * 2 + [None] * 4


def test_task_checks_tags(minilm):
    task = tiny_tagger(minilm, LABELS)
    assert task_class("tagging") is TaggingTask and "token-classification" in task.model.heads
    with pytest.raises(ValueError, match=r"line 7: tag\(s\) \['B-ORG'\] not in the training tags"):
        task.encode({"words": ["EU"], "tags": ["B-ORG"], "line": 7})
    with pytest.raises(ValueError, match="line 3: 2 words but 1 tags"):
        task.encode({"words": ["EU", "x"], "tags": ["O"], "line": 3})
    with pytest.raises(ValueError, match="needs its tag set"):
        tiny_tagger(minilm, None)


# ---- scores -----------------------------------------------------------------------------------------


def test_entity_scores_golden():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-DATE", "O"]]
    predicted = [["B-PER", "I-PER", "O", "O"], ["B-DATE", "B-LOC"]]
    # entities: gold PER, LOC, DATE; predicted PER, DATE, LOC (the wrong one): 2 of 3 right both ways
    scores = entity_scores(gold, predicted)
    assert list(scores) == ["f1", "precision", "recall", "accuracy"]
    assert scores["precision"] == pytest.approx(2 / 3) and scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 / 3) and scores["accuracy"] == pytest.approx(4 / 6)
    # a partly found entity counts as wrong at the entity level
    assert entity_scores([["B-PER", "I-PER"]], [["B-PER", "O"]])["f1"] == 0.0
    assert entity_scores([["O", "O"]], [["O", "O"]]) == {"f1": 0.0, "precision": 0.0, "recall": 0.0,
                                                         "accuracy": 1.0}
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        entity_scores([["O", "O"]], [["O"]])



def test_tags_without_chunks_are_scored_by_word_accuracy_alone():
    from seqeval.metrics import accuracy_score, f1_score

    gold, predicted = [["NN", "NN", "VB"]], [["NN", "NNS", "VB"]]
    # seqeval reads NN as a chunk of type "N" and reports an entity F1 of 0.4 that means nothing
    assert f1_score(gold, predicted) == pytest.approx(0.4)
    scores = tag_scores(gold, predicted, ["NN", "NNS", "VB"])
    assert scores == {"accuracy": pytest.approx(accuracy_score(gold, predicted))}
    assert scores["accuracy"] == pytest.approx(2 / 3)
    # chunk tag sets (IOB2, IOB1, IOBES, BILOU) keep seqeval's entity scores, equal to its own
    gold, predicted = [["B-PER", "I-PER", "O", "S-LOC"]], [["B-PER", "O", "O", "S-LOC"]]
    scores = tag_scores(gold, predicted, ["B-PER", "I-PER", "O", "S-LOC"])
    assert scores["f1"] == f1_score(gold, predicted) == 0.5
    assert is_chunked(["O", "I-MISC"]) and is_chunked(["U-PER", "L-LOC", "O"])
    assert not is_chunked(["O"]) and not is_chunked(["O", "PER"])


def test_bilou_entities_are_split_as_their_iobes_names_and_seqevals_bilou_scheme_split_them():
    from seqeval.metrics import f1_score
    from seqeval.scheme import BILOU

    # gold: two one-word persons; predicted: one two-word person. seqeval's default mode knows no U-/L-
    # and reads both as one entity (F1 1.0); BILOU's own rules (seqeval strict mode) score it 0
    gold, predicted = [["U-PER", "U-PER", "O"]], [["B-PER", "L-PER", "O"]]
    labels = ["B-PER", "L-PER", "O", "U-PER"]
    scores = tag_scores(gold, predicted, labels)
    assert scores["f1"] == f1_score(gold, predicted, mode="strict", scheme=BILOU) == 0.0
    assert scores["recall"] == 0.0 and scores["accuracy"] == pytest.approx(1 / 3)
    assert tag_scores(gold, gold, labels)["f1"] == 1.0
    assert entity_scores([["U-LOC", "B-PER", "L-PER"]], [["U-LOC", "B-PER", "I-PER"]])["f1"] == pytest.approx(
        f1_score([["S-LOC", "B-PER", "E-PER"]], [["S-LOC", "B-PER", "I-PER"]]))


def test_a_word_not_read_is_scored_as_a_miss():
    """None (a word past max_len) scores as "O": its gold entity counts as missed, not as absent."""
    labels = ["B-PER", "I-PER", "O", "S-LOC"]
    gold = [["B-PER", "I-PER", "O", "S-LOC"]]
    assert tag_scores(gold, [["B-PER", "I-PER", None, None]], labels) == tag_scores(
        gold, [["B-PER", "I-PER", "O", "O"]], labels)
    assert tag_scores(gold, [["B-PER", "I-PER", None, None]], labels)["recall"] == 0.5
    assert tag_scores([["NN", "VB"]], [["NN", None]], ["NN", "VB"]) == {"accuracy": 0.5}

# ---- fine-tuning ------------------------------------------------------------------------------------


def test_tiny_finetune_on_the_builtin_tagging_task_beats_the_baseline(tmp_path, builtin):
    from lmforge.tasks.finetune import TaskConfig, evaluate, finetune
    from lmforge.tasks.formats import builtin as builtin_task
    from lmforge.train import TrainConfig

    _, tok = builtin
    kind, data = builtin_task("tagging", 300, seed=0)
    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("bert-base"), vocab_size=tok.vocab_size, max_seq_len=64)
    cfg = TrainConfig(steps=40, batch_size=16, lr=3e-3, warmup=5, log_every=20, progress=False, seed=0)
    summary = finetune(model, tok, kind, data["train"], data["validation"], tmp_path, cfg,
                       TaskConfig(max_len=32),
                       log=lambda *a: None)
    # the trivial baseline: every word "O" (entity F1 0, word accuracy 5/9)
    baseline = entity_scores([r["tags"] for r in data["validation"]],
                             [["O"] * len(r["words"]) for r in data["validation"]])
    assert baseline["f1"] == 0.0 and baseline["accuracy"] == pytest.approx(5 / 9)
    assert summary["primary"] == "f1" and summary["final"]["f1"] > 0.8 and summary["final"]["accuracy"] > 0.9
    # the saved model carries the tagging head and its tags: evaluating it needs nothing else
    scores = evaluate(tmp_path / "final", data["test"], out=tmp_path / "predictions.jsonl")
    assert scores["f1"] > 0.8
    rows = (tmp_path / "predictions.jsonl").read_text().splitlines()
    assert len(rows) == len(data["test"]) and '"prediction": ["B-PER", "I-PER", "O"' in rows[0]


def test_a_sentence_cut_to_max_len_is_counted_and_one_that_fits_is_not(builtin):
    records, tok = builtin[0]["train"][:1], builtin[1]
    task = tiny_tagger(tok, tag_set(records))
    task.encode_all(records)
    assert task.cut == 0
    task.max_len = 4  # its last words unread, tagged "O" unless said
    task.encode_all(records)
    assert task.cut == 1 and len(records[0]["words"]) > 2


def test_unread_words_are_counted_and_said_with_how_they_score(builtin, minilm):
    """A word past the cut (or with no tokens) is said: how many, and that scoring takes it for a missed O."""
    records, tok = builtin[0]["train"][:1], builtin[1]
    task = tiny_tagger(tok, tag_set(records), max_len=4)
    task.encode_all(records)
    lines: list = []
    task.say_cut(1, "evaluated", lines.append)
    n = len(records[0]["words"]) - len({w for w in task.encode(records[0])[0]["word_ids"] if w >= 0})
    assert n > 0 and len(lines) == 2 and lines[1].startswith(f"{n} words of the 1 evaluated records")
    assert "scored as tagged O (a gold entity there counts as missed)" in lines[1]
    task.say_cut(1, "training", lines.append)
    assert lines[-1].endswith("they are not learned from")
    # a lone combining accent has no WordPiece token (accents are stripped): not cut, yet unread and said
    task = tiny_tagger(minilm, ["O"], max_len=64)
    task.encode_all([{"words": ["Peter", "\u0301", "visited"], "tags": ["O", "O", "O"]}])
    lines = []
    task.say_cut(1, "evaluated", lines.append)
    assert task.cut == 0 and task.unread == 1 and lines[0].startswith("1 words of the 1 evaluated")
    task.encode_all([{"words": ["Peter", "visited"], "tags": ["O", "O"]}])
    assert task.unread == 0
