"""CoNLL-U: the treebank round-trips, multiword tokens and empty nodes are skipped, and every
problem is named with its file and line."""
import pytest

from lmforge.data.conllu import read_conllu, write_conllu
from lmforge.data.treebank import treebank

UD = """# sent_id = 1
# text = Don't go.
1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_
1\tDo\tdo\tAUX\t_\t_\t3\taux\t_\t_
2\tn't\tnot\tPART\t_\t_\t3\tadvmod\t_\t_
3\tgo\tgo\tVERB\t_\t_\t0\troot\t_\t_
3.1\tgone\tgo\tVERB\t_\t_\t_\t_\t0:root\t_
4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_

1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_
"""


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_the_treebank_round_trips(tmp_path):
    records = treebank(20, seed=0)
    back = read_conllu(write_conllu(records, tmp_path / "t.conllu"))
    for r, b in zip(records, back):
        assert (b["words"], b["upos"], b["heads"], b["deprels"]) == \
            (r["words"], r["upos"], r["heads"], r["deprels"])
    assert len(back) == 20


def test_multiword_tokens_and_empty_nodes_are_skipped(tmp_path):
    first, second = read_conllu(write(tmp_path / "ud.conllu", UD))
    assert first["words"] == ["Do", "n't", "go", "."]
    assert first["upos"] == ["AUX", "PART", "VERB", "PUNCT"]
    assert first["heads"] == [2, 2, -1, 2]  # 0-based, the root -1
    assert first["line"] == 4
    assert second["words"] == ["Hi"] and second["heads"] == [-1] and second["line"] == 10


@pytest.mark.parametrize("line, message", [
    ("1\tgo\tgo\tVERB\t_\t_\t0\troot", "line 1: 8 tab-separated fields"),
    ("1\tgo\tgo\tVERB\t_\t_\tx\troot\t_\t_", "line 1: HEAD 'x'"),
    ("2\tgo\tgo\tVERB\t_\t_\t0\troot\t_\t_", "line 1: word ID '2', expected 1"),
    ("1\tgo\tgo\tVERB\t_\t_\t5\troot\t_\t_", "line 1: HEAD 5 is past"),
    ("1\ta\ta\tX\t_\t_\t2\tdep\t_\t_\n2\tb\tb\tX\t_\t_\t1\tdep\t_\t_",
     "line 1: the sentence's heads are not a tree: no root"),
    ("1\ta\ta\tX\t_\t_\t0\troot\t_\t_\n2\tb\tb\tX\t_\t_\t0\troot\t_\t_", "2 roots"),
])
def test_errors_name_the_file_and_line(tmp_path, line, message):
    path = write(tmp_path / "bad.conllu", line + "\n")
    with pytest.raises(ValueError, match="bad.conllu: " if "roots" in message else None) as err:
        read_conllu(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_empty_file_and_bad_bytes(tmp_path):
    with pytest.raises(ValueError, match="no sentences"):
        read_conllu(write(tmp_path / "empty.conllu", "# only a comment\n\n"))
    bad = tmp_path / "bytes.conllu"
    bad.write_bytes(b"1\tgo\tgo\tVERB\t_\t_\t0\troot\t_\t_\n\n1\t\xff\n")
    with pytest.raises(ValueError, match="line 3: not valid UTF-8"):
        read_conllu(bad)
