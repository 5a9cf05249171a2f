"""Task files: column mapping, canonical records, and errors that name the file and the line."""
import json

import pytest

from lmforge.config.options import OptionsError
from lmforge.tasks.finetune import evaluate
from lmforge.tasks.formats import (builtin, check_labels, gold_given, label_set, parse_columns, read_records,
                                   read_task_file)


def write(tmp_path, name, text, mode="w"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_csv_with_column_mapping_and_quoted_newline(tmp_path):
    path = write(tmp_path, "t.csv", 'id,sentence,gold\n1,"good, very\ngood",pos\n2,bad,neg\n')
    records = read_records(path, "cls", "text=sentence,label=gold")
    assert records == [{"line": 2, "text": "good, very\ngood", "label": "pos"},
                       {"line": 4, "text": "bad", "label": "neg"}]  # the quoted field spans lines 2-3


def test_tsv_pair_and_jsonl_regression(tmp_path):
    tsv = write(tmp_path, "p.tsv", "text\ttext_pair\tlabel\nA man.\tA person.\tentailment\n")
    assert read_records(tsv, "pair") == [{"line": 2, "text": "A man.", "text_pair": "A person.",
                                          "label": "entailment"}]
    jl = write(tmp_path, "r.jsonl", '{"s1": "a", "s2": "b", "score": 3.8}\n{"s1": "c", "score": "1"}\n')
    records = read_records(jl, "regression", {"text": "s1", "text_pair": "s2", "label": "score"})
    assert records == [{"line": 1, "text": "a", "text_pair": "b", "label": 3.8},
                       {"line": 2, "text": "c", "text_pair": None, "label": 1.0}]


def test_choice_from_columns_and_from_a_list(tmp_path):
    csv_ = write(tmp_path, "c.csv", "ctx,e0,e1,y\nHe sat,down.,up.,1\n")
    assert read_records(csv_, "choice", "text=ctx,choices=e0+e1,label=y") == [
        {"line": 2, "text": "He sat", "choices": ["down.", "up."], "label": 1}]
    jl = write(tmp_path, "c.jsonl", json.dumps({"text": "x", "choices": ["a", "b"], "label": 2}) + "\n")
    with pytest.raises(ValueError, match=r"c.jsonl:1: choice label 2 is outside the 2 choices"):
        read_records(jl, "choice")


@pytest.mark.parametrize("label", ["1.7", "true", "Infinity", "NaN", '"1.0"', '"one"'])
def test_a_choice_label_that_is_no_whole_index_is_refused(tmp_path, label):
    """1.7 was cut to choice 1 and true taken as 1 (int()), Infinity an OverflowError; 1.0 is index 1."""
    record = '{"text": "x", "choices": ["a", "b"], "label": %s}\n'
    jl = write(tmp_path, "c.jsonl", record % label)
    with pytest.raises(ValueError, match=r"^.*c.jsonl:1: choice label .* is not an index$"):
        read_records(jl, "choice")
    assert read_records(write(tmp_path, "ok.jsonl", record % "1.0"), "choice")[0]["label"] == 1


@pytest.mark.parametrize("name, content, kind, columns, message", [
    ("a.csv", "sentence,label\nfine,1\n", "cls", None, r"a.csv:2: no column 'text' \(for text\)"),
    ("b.csv", "text,label\nfine,1\n\nbad,0\n", "cls", None, r"b.csv:3: empty line"),
    ("c.csv", "text,label\nfine,1\n,\n", "cls", None, r"c.csv:3: empty record"),
    ("d.csv", "text,label\nfine\n", "cls", None, r"d.csv:2: 1 fields, but the header"),
    ("e.csv", "text,label\nfine,\n", "cls", None, r"e.csv:2: empty label"),
    ("f.tsv", "text\tlabel\nok\t0.5\nno\thigh\n", "regression", None, r"f.tsv:3: regression label 'high'"),
    ("g.jsonl", '{"text": "a", "label": 1}\n\n{"text": "b", "label": 0}\n', "cls", None,
     r"g.jsonl:2: empty line"),
    ("h.jsonl", '{"text": "a", "label": 1}\n{}\n', "cls", None, r"h.jsonl:2: empty record"),
    # a line that is JSON but no object was called an empty record
    ("n.jsonl", '{"text": "a", "label": 1}\n[1, 2]\n', "cls", None, r"n.jsonl:2: not a JSON object: \[1, 2"),
    ("o.jsonl", '{"text": "a", "label": 1}\nnull\n', "cls", None, r"o.jsonl:2: not a JSON object: null \("),
    ("i.jsonl", '{"text": "a", "label": 1}\n{"text": "b",\n', "cls", None, r"i.jsonl:2: not valid JSON"),
    ("j.csv", b"text,label\nok,1\ncaf\xe9,0\n", "cls", None,
     r"j.csv:3: not valid UTF-8 \(byte 0xe9 at column 4\)"),
    ("k.csv", "text,label\n", "cls", None, r"k.csv: no records"),
    ("l.xml", "<a/>", "cls", None, r"l.xml: unknown task file type"),
    ("m.csv", "text,label\nok,1\n", "cls", "txt=text", r"unknown field\(s\) \['txt'\]"),
])
def test_bad_files_name_the_file_and_line(tmp_path, name, content, kind, columns, message):
    with pytest.raises(OptionsError, match=message) as err:
        read_records(write(tmp_path, name, content), kind, columns)
    assert err.value.field == ("columns" if columns else None)  # a file's fault names no argument
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name, content, kind, columns, where", [
    ("bad.jsonl", '{"text": "a", "label": 1}\n{"text": "b" "label": 0}\n', "cls", None, "2: not valid JSON"),
    ("blank.jsonl", '{"text": "a", "label": 1}\n \n', "cls", None, "2: empty line"),
    ("latin.jsonl", b'{"text": "a", "label": 1}\n{"text": "caf\xe9", "label": 0}\n', "cls", None,
     "2: not valid UTF-8"),
    ("latin.conll", b"EU B-ORG\n\nZ\xfcrich B-LOC\n", "tagging", None, "3: not valid UTF-8"),
    ("wide.csv", "text,label\nok,1\nok,1,2\n", "cls", None, "3: 3 fields, but the header"),
    ("target.csv", "text,label\nok,1\n", "cls", "text=sentence", "2: no column 'sentence' (for text)"),
    ("ragged.conll", "EU B-ORG\nrejects O O\n", "tagging", None, " line 2: 3 columns, but line 1 has 2"),
    ("notag.conll", "EU B-ORG\nrejects\n", "tagging", None, " line 2: 'rejects' has a word but no tag"),
    ("squad.conll", json.dumps({"version": "v2.0", "data": []}), "tagging", None, " JSON with fields"),
    ("list.json", json.dumps({"data": [{"title": "T"}]}), "qa", None, " data[0]: missing 'paragraphs'"),
    ("shape.json", json.dumps([{"question": "Who?"}]), "qa", None, " missing 'data'"),
    ("broken.json", '{"data": [\n  {"paragraphs": [}\n]}', "qa", None, " line 2 column 19: not valid JSON"),
])
def test_a_malformed_task_file_is_a_one_line_options_error_naming_file_and_line(tmp_path, name, content, kind,
                                                                                 columns, where):
    """Every reader of read_task_file refuses a bad file with lmforge's typed error (a ValueError too), whose
    message names the file (and line), and whose field is None: the fault is the file's, not an argument's."""
    path = write(tmp_path, name, content)
    with pytest.raises(OptionsError) as err:
        read_task_file(path, kind, columns)
    message = str(err.value)
    assert message.startswith(f"{path}:{where}"), message
    assert err.value.field is None and "\n" not in message


@pytest.mark.parametrize("columns, message", [
    # read_task_file's argument, beside the command line's flag (it said --columns alone)
    ("txt=text", r"columns \(--columns\) names unknown field\(s\) \['txt'\]; cls has text, label"),
    ("text", r"columns \(--columns\) expects field=column pairs separated by commas, got 'text'"),
])
def test_a_bad_columns_mapping_is_an_options_error_naming_columns(tmp_path, columns, message):
    path = write(tmp_path, "ok.csv", "text,label\nok,1\n")
    with pytest.raises(OptionsError, match=f"^{message}$") as err:
        read_task_file(path, "cls", columns)
    assert err.value.field == "columns"
    with pytest.raises(OptionsError, match="has no CSV/JSONL reader") as err:
        read_records(path, "nope")
    assert err.value.field == "kind"



@pytest.mark.parametrize("name, content", [("dup.csv", "text,label,text\nhello,pos,bye\n"),
                                           ("dup.tsv", "text\tlabel\t text \nhello\tpos\tbye\n")])
def test_a_column_named_twice_in_the_header_is_refused_not_read_as_the_last(tmp_path, name, content):
    # a dict of the row would keep the last 'text' column: a task trained on the wrong text, silently
    message = rf"{name}:1: column 'text' is named twice in the header \(columns 1 and 3\)"
    with pytest.raises(ValueError, match=message):
        read_records(write(tmp_path, name, content), "cls")

def test_labels_unseen_in_training_name_the_line(tmp_path):
    train = read_records(write(tmp_path, "train.csv", "text,label\na,pos\nb,neg\n"), "cls")
    valid = read_records(write(tmp_path, "valid.csv", "text,label\na,pos\nb,neutral\n"), "cls")
    assert label_set(train) == ["neg", "pos"]
    with pytest.raises(ValueError, match=r"valid.csv:3: label 'neutral' does not occur in the training data"):
        check_labels(valid, label_set(train), "valid.csv")


def test_unlabelled_files_and_bom(tmp_path):
    path = write(tmp_path, "u.csv", "\ufefftext\nhello\n")
    assert read_records(path, "cls", labelled=False) == [{"line": 2, "text": "hello", "label": None}]


def test_parse_columns():
    assert parse_columns("text=sentence, label = gold") == {"text": "sentence", "label": "gold"}
    with pytest.raises(ValueError, match="field=column"):
        parse_columns("sentence")


def test_builtin_tasks_are_canonical():
    kind, splits = builtin("entailment", 50, 0)
    assert kind == "pair" and set(splits) == {"train", "validation", "test"}
    r = splits["train"][0]
    assert set(r) == {"text", "text_pair", "label", "line"} and r["label"] in ("0", "1") and r["line"] == 0
    kind, splits = builtin("questions", 20, 0)
    r = splits["validation"][1]
    answer = r["answers"][0]
    assert kind == "qa" and r["context"][answer["start"]:].startswith(answer["text"]) and \
        r["id"] == "validation-1"
    kind, splits = builtin("tagging", 20, 0)
    assert kind == "tagging" and len(splits["train"][0]["words"]) == len(splits["train"][0]["tags"])
    with pytest.raises(OptionsError, match="not one of") as err:
        builtin("nope")
    assert err.value.field == "name"
    with pytest.raises(OptionsError, match="must be an integer") as err:
        builtin("sentiment", 3)
    assert err.value.field == "n"


def test_canonical_jsonl_for_span_tasks(tmp_path):
    path = write(tmp_path, "t.jsonl", json.dumps({"words": ["Ann", "ran"], "tags": ["B-PER", "O"]}) + "\n"
                 + json.dumps({"words": ["x"]}) + "\n")
    with pytest.raises(ValueError, match=r"t.jsonl:2: no field\(s\) \['tags'\]"):
        read_task_file(path, "tagging")


@pytest.mark.parametrize("name, lines, spellings", [
    ("a.jsonl", ['{"text": "a", "label": 1}', '{"text": "b", "label": "1"}'], ('"1"', "1")),
    ("b.jsonl", ['{"text": "a", "label": 1}', '{"text": "b", "label": 1.0}'], ("1.0", "1")),
    ("c.jsonl", ['{"text": "a", "label": true}', '{"text": "b", "label": "true"}'], ('"true"', "true")),
    ("d.csv", ["text,label", "a,1", "b,1.0"], ('"1.0"', '"1"')),
])
def test_a_label_spelled_two_ways_is_an_error_naming_both(tmp_path, name, lines, spellings):
    path = write(tmp_path, name, "\n".join(lines) + "\n")
    line = 3 if name.endswith(".csv") else 2
    with pytest.raises(ValueError) as err:
        read_records(path, "cls")
    message = str(err.value)
    assert message.startswith(f"{path}:{line}: label {spellings[0]} is also spelled {spellings[1]}")
    assert "\n" not in message


def test_labels_are_text_spelled_one_way_per_file(tmp_path):
    ints = write(tmp_path, "i.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": 0}\n')
    strings = write(tmp_path, "s.csv", "text,label\na, 1\nb,0\n")  # surrounding spaces are not part of it
    assert label_set(read_records(ints, "cls")) == label_set(read_records(strings, "cls")) == ["0", "1"]
    nested = write(tmp_path, "n.jsonl", '{"text": "a", "label": [1]}\n')
    with pytest.raises(ValueError, match=r"n.jsonl:1: label \[1\] is not a string, number or boolean"):
        read_records(nested, "cls")


SQUAD = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [{"context": "Ann ran home.", "qas": [
    {"id": "q1", "question": "Who ran?", "answers": [{"text": "Ann", "answer_start": 0}]}]}]}]}


@pytest.mark.parametrize("indent", [None, 2])
def test_squad_json_is_not_read_as_conll(tmp_path, indent):
    path = write(tmp_path, "squad.json", json.dumps(SQUAD, indent=indent))
    with pytest.raises(ValueError) as err:
        read_task_file(path, "tagging")
    assert str(err.value).startswith(f"{path}: JSON with fields 'version', 'data', not a tagging file: "
                                      f"it lacks 'words', 'tags'")


@pytest.mark.parametrize("name, text, kind, message", [
    ("s.txt", "Ann ran,B-PER\nIt is fine, O\n", "tagging", r"s.txt: line 2: 4 columns, but line 1 has 2"),
    ("l.conll", '{"words": ["Ann"], "tags": ["B-PER"]}\n', "tagging",
     r"l.conll: JSON with fields 'words', 'tags', not a tagging file: name a JSON lines file .jsonl"),
    ("w.jsonl", '{"words": "Ann ran", "tags": ["B-PER", "O"]}\n', "tagging",
     r"w.jsonl:1: words must be a non-empty"),
    ("n.jsonl", '{"words": ["Ann", "ran"], "tags": ["B-PER"]}\n', "tagging",
     r"n.jsonl:1: 2 words but 1 tags"),
    ("h.jsonl", json.dumps({"id": "1", "question": "Who?", "context": "Ann ran.",
                            "answers": {"text": ["Ann"], "answer_start": [0]}}) + "\n", "qa",
     r"h.jsonl:1: answers must be a list of"),
    ("o.jsonl", json.dumps({"id": "1", "question": "Who?", "context": "Ann ran.",
                            "answers": [{"text": "Ann", "start": 4}]}) + "\n", "qa",
     r"o.jsonl:1: answers\[0\] 'Ann' is not at character 4"),
    ("squad.json", json.dumps(SQUAD), "cls",
     r"squad.json:1: no columns 'text', 'label' \(for text, label\); the record has 'version', 'data'.*"
     r"if this is a cls file, map them with columns='text=NAME,label=NAME' "
     r"\(--columns text=NAME,label=NAME\)$"),  # was "(columns, --columns, maps fields to columns)"
    ("sts.csv", "sentence1,sentence2,score\na,b,0.5\n", "regression",  # text_pair unmapped: read as none
     r"sts.csv:2: no columns 'text', 'label' .*: if this is a regression file, map them with "
     r"columns='text=NAME,label=NAME' \(--columns text=NAME,label=NAME\), and text_pair=NAME where the "
     r"records have one$"),
    ("c.jsonl", '{"text": "x", "choices": "ab", "label": 0}\n', "choice",
     r"c.jsonl:1: choices \(column 'choices'\) must be a non-empty list; in CSV/TSV name the columns: "
     r"columns='choices=ending0\+ending1\+\.\.\.' \(--columns choices=ending0\+ending1\+\.\.\.\)$"),
])
def test_files_without_the_fields_the_task_needs_are_refused(tmp_path, name, text, kind, message):
    with pytest.raises(ValueError, match=message):
        read_task_file(write(tmp_path, name, text), kind)


def test_records_remember_their_file_so_later_errors_name_it(tmp_path):
    path = write(tmp_path, "mixed.jsonl", '{"text": "a", "label": "x"}\n{"text": "b"}\n')
    records = read_task_file(path, "cls", labelled=False)
    assert records == [{"line": 1, "text": "a", "label": "x"}, {"line": 2, "text": "b", "label": None}]
    with pytest.raises(OptionsError, match=f"^{path}:2: no label, though other records have one") as err:
        gold_given(records, "data", field="data")
    assert err.value.field is None  # the message names the file: no argument is at fault
    with pytest.raises(OptionsError, match=f"^{path}:1: label 'x' does not occur") as err:
        check_labels(records, ["y"], "data", field="data")
    assert err.value.field is None


def test_records_given_in_python_name_their_argument():
    """Records passed in Python (no file) are refused naming the argument they came in, as fields.py does."""
    with pytest.raises(OptionsError, match="^data:2: no label, though other records have one") as err:
        gold_given([{"text": "a", "label": "x"}, {"text": "b"}], "data", field="data")
    assert err.value.field == "data"
    with pytest.raises(OptionsError, match="^validation:4: label 'x' does not occur") as err:
        check_labels([{"text": "a", "label": "x", "line": 4}], ["y"], "validation", field="validation")
    assert err.value.field == "validation"


def test_a_csv_field_over_csvs_limit_is_one_line_naming_file_and_line(tmp_path):
    path = write(tmp_path, "big.csv", 'text,label\nok,1\n"' + "x" * (200 * 1024) + '",1\n')
    with pytest.raises(OptionsError) as err:
        read_records(path, "cls")
    message = str(err.value)
    assert err.value.field is None
    assert "\n" not in message and message.startswith(f"{path}:3:") and "128 KiB" in message


@pytest.mark.parametrize("kind, good, field, bad", [
    ("cls", {"text": "a", "label": "p"}, "text", ["a", "b"]),
    ("pair", {"text": "a", "text_pair": "b", "label": "p"}, "text_pair", {"x": 1}),
    ("seq2seq", {"source": "a", "target": "b"}, "target", ["b"]),
])
def test_a_json_list_or_object_in_a_text_field_is_refused_naming_file_line_field(tmp_path, kind, good,
                                                                                 field, bad):
    path = write(tmp_path, "t.jsonl", json.dumps(good) + "\n" + json.dumps({**good, field: bad}) + "\n")
    with pytest.raises(ValueError) as err:
        read_records(path, kind)
    assert str(err.value).startswith(f"{path}:2: {field} (column '{field}') must be text"), str(err.value)


@pytest.mark.parametrize("name, text", [
    ("r.jsonl", '{"text": "a", "label": 1.5}\n{"text": "b", "label": NaN}\n'),
    ("r.csv", "text,label\na,1.5\nb,inf\n"),
    ("r.tsv", "text\tlabel\na\t1.5\nb\t-Infinity\n"),
])
def test_a_regression_label_that_is_not_finite_is_refused_naming_file_and_line(tmp_path, name, text):
    path = write(tmp_path, name, text)
    line = 2 if name.endswith(".jsonl") else 3
    with pytest.raises(ValueError, match="not a finite number") as err:
        read_records(path, "regression")
    assert str(err.value).startswith(f"{path}:{line}:")


def test_no_records_to_evaluate_is_refused_naming_the_argument():
    """evaluate(model, []) failed inside the scoring, "no examples to score": a plain ValueError naming
    nothing (an empty file is refused by its reader)."""
    with pytest.raises(OptionsError, match=r"^data: no records \(an empty list\): nothing to") as err:
        gold_given([], "data", field="data")
    assert err.value.field == "data"


@pytest.mark.parametrize("records", [[], iter([])], ids=["list", "generator"])
@pytest.mark.parametrize("kind", [None, "cls"])
def test_evaluate_of_no_records_is_refused_naming_data_before_the_model_is_read(tmp_path, records, kind):
    """evaluate(model, []) itself, not only gold_given: an OptionsError naming data, never {} metrics (what
    records without labels get) nor the scoring's "no examples to score"; the model (missing here) unread."""
    out, said = tmp_path / "predictions.jsonl", r"^data: no records \(an empty list\): nothing to evaluate$"
    with pytest.raises(OptionsError, match=said) as err:
        evaluate(tmp_path / "missing", records, kind=kind, out=out)
    assert err.value.field == "data" and not out.exists()
