"""results.jsonl is verified on read: a row edited since it was written, or any damaged line but a
torn last one, is refused naming file:line; a torn last line is cut; every row starts a line of its own."""
from __future__ import annotations

import json
import re
import warnings

import pytest

from lmforge.bakeoff.results import (RESULTS, ResultsError, ResultsWarning, append_row, mend, read_results,
                                     replace_row, stamped)


def row(arm="mlm", seed=0, value=0.5):
    return {"plan": "tiny", "arm": arm, "seed": seed, "task": "sentiment", "metric": "accuracy",
            "value": value,
            "metrics": {"accuracy": value}, "budget": 30000000, "fingerprint": f"{arm}{seed}"}


def three(out):
    """Three rows written as the runner writes them; the file's lines."""
    for arm, seed in [("mlm", 0), ("mlm", 1), ("electra", 0)]:
        append_row(out, row(arm, seed))
    return (out / RESULTS).read_text().splitlines()


def quiet_read(out):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean file reads without a word
        return read_results(out)


def test_rows_written_are_read_back_verified(tmp_path):
    three(tmp_path)
    rows = quiet_read(tmp_path)
    assert [(r["arm"], r["seed"]) for r in rows] == [("mlm", 0), ("mlm", 1), ("electra", 0)]
    assert all(r == stamped(r) for r in rows)  # each carries the checksum of its own content


def test_an_edited_value_is_refused_naming_its_line(tmp_path):
    lines = three(tmp_path)
    lines[1] = lines[1].replace('"value": 0.5,', '"value": 0.99,')  # sed -i '2s/.../.../'
    (tmp_path / RESULTS).write_text("\n".join(lines) + "\n")
    said = f"{tmp_path / RESULTS}:2: the row does not match its checksum"
    with pytest.raises(ResultsError, match=re.escape(said)):
        read_results(tmp_path)


def test_a_second_row_of_a_unit_is_refused_naming_both_lines(tmp_path):
    """A run replaces a unit's row; two rows of one unit would count it twice in the report's n."""
    lines = three(tmp_path)
    (tmp_path / RESULTS).write_text("\n".join([*lines, lines[0]]) + "\n")  # a second writer, or a hand
    first = "a second row of arm mlm, seed 0, task sentiment (line 1 is the first)"
    with pytest.raises(ResultsError, match=re.escape(f"{tmp_path / RESULTS}:4: {first}")):
        read_results(tmp_path)


@pytest.mark.parametrize("bad", ["not json", '{"arm": "mlm", "budget": 30000000{"plan": "tiny"}', "[1, 2]",
                                 '{"arm": "mlm"}'])
def test_a_bad_line_before_the_last_is_refused_naming_it(tmp_path, bad):
    """Only a torn LAST line is a write cut short; anywhere else (or whole, with its newline) it is damage."""
    lines = three(tmp_path)
    for where, number in [(1, 2), (3, 4)]:  # in the middle; last but with its newline (the old glued rows)
        text = lines[:where] + [bad] + lines[where:]
        (tmp_path / RESULTS).write_text("\n".join(text) + "\n")
        with pytest.raises(ResultsError, match=re.escape(f"{tmp_path / RESULTS}:{number}:")):
            read_results(tmp_path)


def test_a_torn_last_line_is_left_out_by_a_reader_and_cut_by_mend(tmp_path):
    three(tmp_path)
    path = tmp_path / RESULTS
    whole = path.read_bytes()
    path.write_bytes(whole[:-40])  # truncate -s -40
    with pytest.warns(ResultsWarning, match=re.escape(f"{path}: its last line is torn")):
        assert [r["arm"] for r in read_results(tmp_path)] == ["mlm", "mlm"]
    assert path.read_bytes() == whole[:-40]  # a reader never writes
    with pytest.warns(ResultsWarning, match=re.escape(f"{path}: its last line was torn")):
        mend(tmp_path)
    assert whole.startswith(path.read_bytes()) and path.read_bytes().endswith(b"\n")
    assert len(quiet_read(tmp_path)) == 2


def test_a_row_always_starts_a_line_of_its_own(tmp_path):
    """A torn tail is cut before the append (never glued to the new row); a whole last row written
    without its newline (by hand) is kept and given one."""
    path = tmp_path / RESULTS
    path.write_text(json.dumps(stamped(row())) + "\n" + json.dumps(stamped(row(seed=1)))[:-40])
    with pytest.warns(ResultsWarning):
        append_row(tmp_path, row(seed=2))
    assert [r["seed"] for r in quiet_read(tmp_path)] == [0, 2]
    path.write_text(json.dumps(stamped(row())))
    append_row(tmp_path, row(seed=1))
    assert [r["seed"] for r in quiet_read(tmp_path)] == [0, 1]


def test_rows_without_a_checksum_are_read_with_a_warning_and_never_signed(tmp_path):
    """Rows written before rows carried a checksum still read (unverified, said once per read); a rewrite
    of the file keeps them as they were rather than vouching for them."""
    path = tmp_path / RESULTS
    path.write_text(json.dumps(row()) + "\n" + json.dumps(row(seed=1)) + "\n")
    with pytest.warns(ResultsWarning, match=re.escape(f"{path}: 2 row(s) without a checksum")):
        assert len(read_results(tmp_path)) == 2
    with pytest.warns(ResultsWarning):
        replace_row(tmp_path, row(seed=1, value=0.7))
    old, new = (json.loads(line) for line in path.read_text().splitlines())
    assert "checksum" not in old and new == stamped(row(seed=1, value=0.7))


def test_the_command_refuses_an_edited_result_with_exit_status_2(tmp_path, tiny_plan, capsys):
    from lmforge.cli import main

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(tiny_plan))
    out = tmp_path / "out"
    out.mkdir()
    append_row(out, row())
    (out / RESULTS).write_text((out / RESULTS).read_text().replace('"value": 0.5,', '"value": 0.99,'))
    status = main(["bakeoff", "--plan", str(plan), "--out", str(out), "--report"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and f"{out / RESULTS}:1:" in err, err
    assert not (out / "report.md").exists()  # no report built on the edited number
