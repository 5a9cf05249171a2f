"""run_heads, the Python face of `lmforge heads`: an output folder that is a symbolic link is refused (as
the command line refuses it) before the model is read, and nothing is written where it points."""
import pytest

from lmforge.analysis.head_report import run_heads
from lmforge.utils.atomic import UnsafePath


def test_a_link_as_the_output_folder_is_refused_before_any_work(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(UnsafePath, match="out: is a symbolic link"):
        run_heads(tmp_path / "no-model", [], tmp_path / "out")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_one_level_curve_gets_a_percent_axis_with_importance_drawn_on_top(tmp_path, monkeypatch):
    """Only the unpruned level: the axis spans 0..100 % (not +-0.04 %), and the importance point, equal
    to random's there, is drawn over it rather than hidden under it."""
    from lmforge.analysis import head_report

    caught = []
    monkeypatch.setattr(head_report, "atomic_savefig", lambda fig, path: caught.append(fig.axes[0]))
    level = [{"fraction": 0.0, "metric": 0.9}]
    head_report.plot_curves({"importance": level, "random": level}, "accuracy", tmp_path / "heads.png")
    ax = caught[0]
    low, high = ax.get_xlim()
    assert low < 0 and high > 100 and ax.get_xlabel() == "heads pruned (%)" and ax.get_ylabel() == "accuracy"
    importance, random = ax.lines
    assert importance.get_zorder() > random.get_zorder()


@pytest.mark.parametrize("orders, labels", [
    (1, ["importance", "random"]),
    (3, ["importance", "random (mean of 3 orders)", "random ± 1 sd"])])
def test_the_random_band_is_drawn_and_named_only_for_several_orders(tmp_path, monkeypatch, orders, labels):
    from lmforge.analysis import head_report

    caught = []
    monkeypatch.setattr(head_report, "atomic_savefig", lambda fig, path: caught.append(fig.axes[0]))
    levels = [{"fraction": f, "metric": 0.9 - f} for f in (0.0, 0.5)]
    sd = 0.0 if orders == 1 else 0.1
    band = [{"fraction": f, "mean": 0.9 - f, "sd": sd, "n": orders} for f in (0.0, 0.5)]
    head_report.plot_curves({"importance": levels}, "accuracy", tmp_path / "heads.png", band=band)
    assert [t.get_text() for t in caught[0].get_legend().get_texts()] == labels


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    """A tiny BERT (2 layers x 4 heads) with its task.json, untrained: the order and masking of the heads
    are what is tested, on whatever importances the gates give."""
    from tests.tasks.core import saved_classifier, sentiment

    data = sentiment(200)
    folder = tmp_path_factory.mktemp("sst") / "m"
    return saved_classifier(folder, "bert-base", "bert", data["train"], 64), data


def test_each_level_masks_the_heads_least_important_at_the_gates_before_it_and_is_scored_anew(fine_tuned,
                                                                                                   tmp_path):
    """Michel et al. sec. 4.3 as run_heads reports it: the importance table is I_h L2-normalised per layer;
    level i masks the heads least important at level i - 1's gates (re-estimated, never a layer's last
    head), and its metric is the task's metric with exactly the heads of levels 1..i masked."""
    import torch

    from lmforge.analysis.head_report import HeadsOptions
    from lmforge.compress.head_importance import gates_at, head_importance, metric
    from lmforge.tasks.finetune import encode_split, fine_tuned_task

    path, data = fine_tuned
    records = data["validation"][:48]
    report = run_heads(path, records, tmp_path / "out", options=HeadsOptions(step=0.25, random_orders=1))
    task = fine_tuned_task(path, records)
    examples = encode_split(task, records, "data")
    assert all(abs(float(torch.tensor(layer).norm()) - 1) < 1e-4 for layer in report["importance"]["encoder"])
    levels = report["curves"]["importance"]
    assert [lv["pruned"] for lv in levels] == [0, 2, 4, 6]
    for i in range(1, len(levels)):
        before = gates_at(task.model.config, levels[:i])
        scores = head_importance(task, examples, before, batch_size=32)["encoder"]
        on = sorted((float(scores[layer][h]), layer, h) for layer, g in enumerate(before["encoder"])
                    for h in range(g.numel()) if g[h] > 0)
        left, want = [int((g > 0).sum()) for g in before["encoder"]], []
        for _, layer, h in on:
            if len(want) < 2 and left[layer] > 1:
                want.append(["encoder", layer, h])
                left[layer] -= 1
        assert levels[i]["masked"] == want
        after = gates_at(task.model.config, levels[:i + 1])
        assert levels[i]["metric"] == metric(task, records, examples, after)[1]


def test_an_out_that_holds_the_model_read_is_refused_before_any_work(tmp_path):
    """run_heads("p/pruned", ..., out="p", prune) replaced the model it read with OUT/pruned (the command's
    --out refused it); an out inside the model folder, beside its files, is still written."""
    from lmforge.analysis.head_report import HeadsOptions

    model = tmp_path / "p" / "pruned"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    for out in (tmp_path / "p", model):
        with pytest.raises(UnsafePath, match=f"^out {out} (is|holds) the input model_dir ") as err:
            run_heads(model, [], out, options=HeadsOptions(prune=0.5))
        assert err.value.field == "out"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["config.json", "p", "pruned"]  # nothing written


@pytest.mark.parametrize("records, importance, said", [
    ("good", None, "^records must be a list"), ([], None, "^records is empty"),
    ([{"text": "good"}], None, "^records:1: "), (["good"], None, "^records:1: a record is a dict"),
    ([{"text": "good", "label": "pos"}], [], "^importance_records is empty")])
def test_bad_records_are_refused_before_the_model_is_loaded(fine_tuned, tmp_path, monkeypatch, records,
                                                             importance, said):
    """run_heads checked its records only after fine_tuned_task had loaded the model: now as prune's are
    (compress.measure.given_data), by the kind the folder's task.json says; the loader fails if reached."""
    import lmforge.tasks.finetune as finetune
    from lmforge.config.options import OptionsError

    monkeypatch.setattr(finetune, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(OptionsError, match=said):
        run_heads(fine_tuned[0], records, tmp_path / "out", importance_records=importance)
    assert not (tmp_path / "out").exists()  # refused before OUT was made
