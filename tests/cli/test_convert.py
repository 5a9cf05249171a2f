"""`lmforge convert SRC DST`: DST is replaced as a whole (nothing old left behind), SRC's tokenizer
goes with the weights, and a DST that is SRC, inside it, holding it, or not a model folder is refused."""
import json

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.heads import attach
from lmforge.tokenizer import load_tokenizer, train_tokenizer

TEXTS = ["the cat sat on the mat", "a dog ran in the park"] * 20


@pytest.fixture
def source(tmp_path):
    """An lmforge model directory with its tokenizer and task.json."""
    tokenizer = train_tokenizer(TEXTS, "wordpiece", 60)
    model = lmforge.build(lmforge.tiny("bert-base"), vocab_size=tokenizer.vocab_size).eval()
    attach(model, "lm")
    path = tmp_path / "src"
    model.save(path)
    tokenizer.save(path)
    (path / "task.json").write_text('{"kind": "cls", "labels": ["a", "b"]}\n')
    return path


def _one_line(capsys, message):
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_convert_carries_the_tokenizer_and_leaves_nothing_old(tmp_path, source, capsys):
    dst = tmp_path / "dst"
    lmforge.build(lmforge.tiny("gpt2")).save(dst)  # an older model folder, with files of its own
    train_tokenizer(TEXTS, "bytelevel-bpe", 300).save(dst)
    (dst / "vocab.json").write_text("{}")  # a stale file of another tokenizer
    for to in ("hf", "lmforge"):
        assert main(["convert", str(source), str(dst), "--to", to]) == 0
        assert "tokenizer.json" in capsys.readouterr().out
        assert not (dst / "vocab.json").exists()
        names = {p.name for p in dst.iterdir()}
        assert names == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                         "task.json"}
        ours, theirs = load_tokenizer(dst), load_tokenizer(source)
        assert ours.encode("the cat ran").ids == theirs.encode("the cat ran").ids
        back = lmforge.load(dst)
        assert all(torch.equal(back.state_dict()[k], v) for k, v in lmforge.load(source).state_dict().items())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left


def test_an_older_tokenizer_config_is_named_its_model_inputs_when_carried(tmp_path, source):
    """A tokenizer saved before model_input_names were written gave an exported BERT no token_type_ids in
    the reference (transformers 5): a pair's second segment read as the first."""
    from lmforge.utils.model_folder import record_sums

    config = json.loads((source / "tokenizer_config.json").read_text())
    assert config.pop("model_input_names") == ["input_ids", "token_type_ids", "attention_mask"]
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    record_sums(source, ["tokenizer_config.json"])  # as that older save recorded it
    assert main(["convert", str(source), str(tmp_path / "hf"), "--to", "hf"]) == 0
    carried = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert carried == {**config, "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}
    text = "the cat"
    assert load_tokenizer(tmp_path / "hf").encode(text).ids == load_tokenizer(source).encode(text).ids


def test_the_files_carried_into_an_lmforge_dst_are_verified_there(tmp_path, source, capsys):
    """They were copied unrecorded, so DST read them unverified (a changed label of task.json unsaid)."""
    assert main(["convert", str(source), str(tmp_path / "dst"), "--to", "lmforge"]) == 0
    sums = json.loads((tmp_path / "dst" / "config.json").read_text())["sha256"]
    assert {"tokenizer.json", "tokenizer_config.json", "task.json"} <= set(sums)
    task = tmp_path / "dst" / "task.json"
    task.write_text(task.read_text().replace('"b"', '"c"'))
    assert main(["convert", str(tmp_path / "dst"), str(tmp_path / "again")]) == 2
    _one_line(capsys, f"{task} does not match its checksum")


def test_convert_into_itself_or_around_itself_is_refused(tmp_path, source, capsys):
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    for dst, message in ((source, "is SRC"), (source / "inner", "inside it"), (tmp_path, "holds SRC")):
        assert main(["convert", str(source), str(dst)]) == 2
        _one_line(capsys, message)
        assert main(["convert", str(source), str(dst), "--force"]) == 2  # never, even forced
        _one_line(capsys, message)
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before


def test_a_folder_that_is_not_a_model_is_replaced_only_with_force(tmp_path, source, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "thesis.txt").write_text("years of work")
    assert main(["convert", str(source), str(notes)]) == 2
    _one_line(capsys, "not a model folder")
    assert (notes / "thesis.txt").read_text() == "years of work"
    file = tmp_path / "file.txt"
    file.write_text("x")
    assert main(["convert", str(source), str(file)]) == 2
    _one_line(capsys, "is a file")
    assert main(["convert", str(source), str(notes), "--force"]) == 0
    assert not (notes / "thesis.txt").exists() and lmforge.load(notes) is not None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["convert", str(source), str(empty)]) == 0  # an empty folder needs no --force


def test_a_failed_convert_leaves_dst_as_it_was(tmp_path, source, capsys):
    dst = tmp_path / "dst"
    assert main(["convert", str(source), str(dst)]) == 0
    before = {p.name: p.read_bytes() for p in dst.iterdir()}
    config = json.loads((source / "config.json").read_text())
    config["config"]["n_heads"] = 5  # d_model 32 is not divisible: the load fails
    (source / "config.json").write_text(json.dumps(config))
    assert main(["convert", str(source), str(dst)]) == 2
    _one_line(capsys, "n_heads")
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_sentence_transformers_files_travel_too(tmp_path, source, capsys):
    modules = [{"path": "", "type": "x.Transformer"}, {"path": "1_Pooling", "type": "x.Pooling"},
               {"path": "../outside", "type": "x.Normalize"}]  # only a plain child folder is copied
    (source / "modules.json").write_text(json.dumps(modules))
    (source / "1_Pooling").mkdir()
    (source / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    assert main(["convert", str(source), str(tmp_path / "dst")]) == 0
    dst = tmp_path / "dst"
    assert (dst / "1_Pooling" / "config.json").is_file() and (dst / "modules.json").is_file()


@pytest.mark.parametrize("name, damage", [("tokenizer.json", lambda text: text[: len(text) // 2]),
                                          ("task.json", lambda text: "{not json")])
def test_a_damaged_tokenizer_or_task_file_is_refused_before_anything_is_written(tmp_path, source, capsys,
                                                                                 name, damage):
    """convert copied a cut tokenizer.json or a junk task.json and said 'wrote': the next job failed on the
    copy. Both are read as the jobs read them first, and a damaged one is refused naming it."""
    file = source / name
    file.write_text(damage(file.read_text()))
    capsys.readouterr()
    assert main(["convert", str(source), str(tmp_path / "dst")]) == 2
    _one_line(capsys, name)
    assert not (tmp_path / "dst").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".dst")]


def test_a_tokenizer_json_gone_though_src_records_it_is_refused_before_any_write(tmp_path, source, capsys):
    """Without its tokenizer.json, SRC's tokenizer_config.json alone was copied and convert said 'wrote': the
    next job found no tokenizer in DST. A file SRC's config.json records is read as the jobs read it."""
    (source / "tokenizer.json").unlink()
    capsys.readouterr()
    assert main(["convert", str(source), str(tmp_path / "dst")]) == 2
    _one_line(capsys, "tokenizer.json: missing, though")
    assert not (tmp_path / "dst").exists()


def test_a_dst_under_a_file_or_a_link_to_nothing_is_refused_naming_dst(tmp_path, source, capsys):
    (tmp_path / "afile").write_text("kept")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    for above, what in (("afile", "a file"), ("gone", "a symbolic link to nothing")):
        assert main(["convert", str(source), str(tmp_path / above / "dst"), "--force"]) == 2
        _one_line(capsys, f"DST {tmp_path / above / 'dst'}: {tmp_path / above} is {what}, not a folder")
    assert (tmp_path / "afile").read_text() == "kept" and not (tmp_path / "nowhere").exists()


def test_a_classifier_exported_to_hf_names_its_labels_as_the_task_does(tmp_path):
    """config.json said LABEL_0, LABEL_1: the reference's pipelines named the predictions so."""
    transformers = pytest.importorskip("transformers")
    tokenizer = train_tokenizer(TEXTS, "wordpiece", 60)
    model = lmforge.build(lmforge.tiny("bert-base"), vocab_size=tokenizer.vocab_size).eval()
    attach(model, "classification", n_labels=3)
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.save(src)
    tokenizer.save(src)
    (src / "task.json").write_text('{"kind": "cls", "labels": ["neg", "neutral", "pos"]}\n')
    assert main(["convert", str(src), str(dst), "--to", "hf"]) == 0
    config = transformers.AutoConfig.from_pretrained(dst)
    assert config.id2label == {0: "neg", 1: "neutral", 2: "pos"} and config.label2id["pos"] == 2
    assert lmforge.tasks.finetune.task_info(dst)["labels"] == ["neg", "neutral", "pos"]


@pytest.mark.parametrize("problem, n", [("multi_label_classification", 3), ("regression", 2),
                                        ("regression", 1)])
def test_a_reference_classifiers_problem_type_survives_convert_to_hf(tmp_path, problem, n):
    """A multilabel checkpoint came back with no problem_type: the reference then read its outputs as one
    softmax (and a 2-output regression as 2 classes), its loss and pipeline another task's."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                     problem_type=problem, id2label={i: f"tag{i}" for i in range(n)})
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "src")
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--to", "hf"]) == 0
    back = transformers.AutoConfig.from_pretrained(tmp_path / "dst")
    assert back.problem_type == problem and back.id2label == config.id2label


def test_a_multilabel_tasks_export_says_so(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = lmforge.build(lmforge.tiny("bert-base")).eval()
    attach(model, "classification", n_labels=2)
    model.save(tmp_path / "src")
    (tmp_path / "src" / "task.json").write_text('{"kind": "multilabel", "labels": ["x", "y"]}\n')
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--to", "hf"]) == 0
    exported = transformers.AutoConfig.from_pretrained(tmp_path / "dst")
    assert exported.problem_type == "multi_label_classification"


def _reference(tmp_path, architecture, problem, n, id2label=True):
    """A tiny transformers BERT of `architecture` saved to tmp_path/hf, with its tokenizer."""
    transformers = pytest.importorskip("transformers")
    tokenizer = train_tokenizer(TEXTS, "wordpiece", 60)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                     problem_type=problem, id2label={i: f"tag{i}" for i in range(n)})
    getattr(transformers, architecture)(config).eval().save_pretrained(tmp_path / "hf")
    tokenizer.save(tmp_path / "hf")
    if not id2label:  # as transformers 5 saves default labels: num_labels alone
        saved = json.loads((tmp_path / "hf" / "config.json").read_text())
        saved = {k: v for k, v in saved.items() if k not in ("id2label", "label2id")}
        (tmp_path / "hf" / "config.json").write_text(json.dumps({**saved, "num_labels": n}))
    return transformers, tmp_path / "hf"


ROUND_TRIPS = [("BertForSequenceClassification", "multi_label_classification", 3, "multilabel"),
               ("BertForSequenceClassification", "regression", 1, None),
               ("BertForSequenceClassification", "regression", 2, None),
               ("BertForSequenceClassification", None, 3, None),
               ("BertForSequenceClassification", "single_label_classification", 3, None),
               ("BertForTokenClassification", None, 4, "tagging")]


@pytest.mark.parametrize("architecture, problem, n, kind", ROUND_TRIPS)
def test_a_reference_classifier_keeps_its_meaning_through_lmforges_format(tmp_path, architecture, problem, n,
                                                                           kind):
    """HF -> lmforge wrote no task.json, so the way back said LABEL_i and no problem_type (a multilabel
    head then read as one softmax, a regressor as classes), and evaluate had to be told the task again."""
    transformers, hf = _reference(tmp_path, architecture, problem, n)
    mid, back = tmp_path / "mid", tmp_path / "back"
    assert main(["convert", str(hf), str(mid)]) == 0
    info = lmforge.tasks.finetune.task_info(mid)
    assert info.get("kind") == kind and info["max_len"] == 64
    assert info.get("labels", info.get("id2label")) == [f"tag{i}" for i in range(n)]
    assert main(["convert", str(mid), str(back), "--to", "hf"]) == 0
    ours, theirs = (json.loads((p / "config.json").read_text()) for p in (back, hf))
    assert (ours["id2label"], ours.get("problem_type")) == (theirs["id2label"], theirs.get("problem_type"))
    assert ours["label2id"] == {label: int(i) for i, label in theirs["id2label"].items()}
    ids = torch.tensor([[2, 5, 7, 9, 3]])
    reference = getattr(transformers, architecture)
    before, after = (reference.from_pretrained(p).eval()(ids).logits for p in (hf, back))
    torch.testing.assert_close(after, before)


def test_a_converted_classifier_is_evaluated_without_its_task_named(tmp_path, capsys):
    _, hf = _reference(tmp_path, "BertForSequenceClassification", "multi_label_classification", 3)
    assert main(["convert", str(hf), str(tmp_path / "mid")]) == 0
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "the cat sat", "label": ["tag0", "tag2"]}\n'
                    '{"text": "a dog ran", "label": []}\n')
    capsys.readouterr()
    assert main(["evaluate", "--model", str(tmp_path / "mid"), "--data", str(data)]) == 0
    assert json.loads(capsys.readouterr().out)["task"] == "multilabel"


def test_a_backbone_or_a_language_model_is_given_no_task(tmp_path):
    for architecture in ("BertModel", "BertForMaskedLM"):
        _, hf = _reference(tmp_path / architecture, architecture, None, 2)
        assert main(["convert", str(hf), str(tmp_path / architecture / "mid")]) == 0
        assert not (tmp_path / architecture / "mid" / "task.json").exists()


def test_a_classifier_without_id2label_reads_its_class_ids(tmp_path):
    """transformers 5 saves default labels as num_labels alone: the outputs are the class ids."""
    _, hf = _reference(tmp_path, "BertForSequenceClassification", "multi_label_classification", 3,
                       id2label=False)
    assert main(["convert", str(hf), str(tmp_path / "mid")]) == 0
    info = lmforge.tasks.finetune.task_info(tmp_path / "mid")
    assert info["kind"] == "multilabel" and info["outputs"] == 3 and "labels" not in info


def test_convert_refuses_a_reference_config_naming_outputs_it_lacks_in_one_line(tmp_path, capsys):
    _, hf = _reference(tmp_path, "BertForSequenceClassification", None, 2)
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "id2label": {"0": "a", "2": "b"}}))
    capsys.readouterr()
    assert main(["convert", str(hf), str(tmp_path / "mid")]) == 2
    _one_line(capsys, "config.json: id2label keys must be the outputs 0..1")
    assert not (tmp_path / "mid").exists()


def test_a_changed_task_json_of_a_converted_classifier_is_refused_in_one_line(tmp_path, capsys):
    _, hf = _reference(tmp_path, "BertForTokenClassification", None, 2)
    assert main(["convert", str(hf), str(tmp_path / "mid")]) == 0
    task = tmp_path / "mid" / "task.json"
    task.write_text(task.read_text().replace('"tag1"', '"tag9"'))
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "mid"), str(tmp_path / "back"), "--to", "hf"]) == 2
    _one_line(capsys, "task.json")


# HF's legacy BERT layout: config.json, weights and vocab.txt, no tokenizer.json; an accented word, [UNK]
LEGACY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "The",
                "Cat", "café", "cafe", "Café", "naïve", "naive", "dog", "##s", "##ing", "run", ".", ",", "!",
                "a", "?"]
LEGACY_TEXTS = ["The cat sat on the mat.", "Café naïve, cafe naive!", "the zebra runs", "Cats running?"]


@pytest.mark.parametrize("tokenizer_config, cafe", [(None, "cafe"), ({"do_lower_case": False}, "Café")])
def test_a_source_whose_tokenizer_is_only_a_vocab_txt_encodes_alike_after_convert(tmp_path, capsys,
                                                                                 tokenizer_config, cafe):
    """A BERT saved as vocab.txt (+ tokenizer_config.json) and no tokenizer.json: the reference's tokenizer
    on DST and lmforge's give SRC's ids and segments (lower-casing and accents as SRC's config says)."""
    transformers = pytest.importorskip("transformers")
    src, dst = tmp_path / "src", tmp_path / "dst"
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(LEGACY_VOCAB), hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(src)
    (src / "vocab.txt").write_text("\n".join(LEGACY_VOCAB) + "\n", encoding="utf-8")
    if tokenizer_config is not None:
        (src / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    assert not (src / "tokenizer.json").exists()
    assert main(["convert", str(src), str(dst), "--to", "hf"]) == 0
    capsys.readouterr()
    theirs, back = (transformers.AutoTokenizer.from_pretrained(p) for p in (src, dst))
    ours = load_tokenizer(dst)
    pairs = [("The café", "a dog runs."), ("naïve zebra", "Cat")]
    for text, pair in [(t, None) for t in LEGACY_TEXTS] + pairs:
        expected = theirs(text, pair)
        assert {k: back(text, pair)[k] for k in ("input_ids", "token_type_ids")} == {
            k: expected[k] for k in ("input_ids", "token_type_ids")}, (text, pair)
        encoded = ours.encode(text, pair)
        assert (encoded.ids, encoded.segment_ids) == (expected["input_ids"], expected["token_type_ids"])
    ids = theirs("Café zebra")["input_ids"]  # SRC's casing is kept: the test means something in each variant
    assert ids == [LEGACY_VOCAB.index(t) for t in ("[CLS]", cafe, "[UNK]", "[SEP]")]
