"""lmforge/progress.Bar: items done of a total, extra columns, standard error where asked, silent when off."""
from lmforge.train.log import Progress
from lmforge.utils.progress import Bar


def test_a_bar_shows_its_count_and_columns_on_the_stream_asked(capsys):
    bar = Bar(5, "embed", stderr=True, fields={"loss": "loss {}"})
    bar.update(3, loss="0.25")
    bar.close()
    out, err = capsys.readouterr()
    assert out == "" and "embed" in err and "3/5" in err and "loss 0.25" in err


def test_a_disabled_bar_draws_nothing(capsys):
    bar = Progress(10, 0, enabled=False)
    bar.update(4, loss=1.0, tokens_per_s=100.0)
    bar.close()
    assert capsys.readouterr() == ("", "")


def test_a_training_bar_formats_loss_and_speed(capsys):
    bar = Progress(10, 2, enabled=True, label="train (3 epochs)")
    bar.update(7, loss=1.23456, tokens_per_s=12345.6)
    bar.close()
    out = capsys.readouterr().out
    assert "train (3 epochs)" in out and "7/10" in out and "loss 1.2346" in out and "12,346 tok/s" in out
