"""The demo's outputs: a symbolic link as its folder or any folder it writes (the tokenizer, each run and its
checkpoints) is refused naming it before any work, and nothing is written where it points."""
import pytest

from lmforge.pipelines import demo
from lmforge.utils.atomic import UnsafePath


@pytest.mark.parametrize("link", ["out", "out/tokenizer", "out/pretrain", "out/pretrain/checkpoints",
                                  "out/tagging-from-scratch", "out/sentiment-pretrained/checkpoints"])
def test_a_link_at_any_folder_the_demo_writes_is_refused_naming_it_before_any_work(tmp_path, monkeypatch,
                                                                                   link):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / link).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / link).symlink_to(target, target_is_directory=True)
    monkeypatch.setattr(demo, "make_tokenizer", lambda *a: pytest.fail("work began before the refusal"))
    with pytest.raises(UnsafePath, match=f"^{tmp_path / link}: is a symbolic link"):
        demo.run_demo(tmp_path / "out", cfg=demo.DemoConfig.quick())
    assert list(target.iterdir()) == []



@pytest.mark.parametrize("name", ["", "afile"])
def test_an_empty_name_or_a_file_as_the_demo_folder_is_refused_before_any_work(tmp_path, monkeypatch, name):
    (tmp_path / "afile").write_text("the user's")
    monkeypatch.chdir(tmp_path)  # "" would be the working folder
    monkeypatch.setattr(demo, "make_tokenizer", lambda *a: pytest.fail("work began before the refusal"))
    with pytest.raises(UnsafePath, match="^out is empty: name the output folder|afile: exists and is not a"):
        demo.run_demo(name, cfg=demo.DemoConfig.quick())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_the_from_scratch_control_is_drawn_from_the_seed_not_the_global_rng():
    import torch

    from lmforge.presets import get_config

    cfg = get_config("bert-tiny", n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=50)
    torch.manual_seed(1)
    a = demo.scratch_twin(cfg, 3).state_dict()
    torch.manual_seed(2)  # another process starts the global RNG elsewhere
    b, c = demo.scratch_twin(cfg, 3).state_dict(), demo.scratch_twin(cfg, 4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_an_earlier_run_names_the_argument_beside_the_flag(tmp_path, monkeypatch):
    """run_demo(out) said "pass another --out", a flag the Python caller never gave: out, and the flag."""
    (tmp_path / "out" / "pretrain").mkdir(parents=True)
    monkeypatch.setattr(demo, "make_tokenizer", lambda *a: pytest.fail("work began before the refusal"))
    with pytest.raises(FileExistsError, match=r"holds an earlier demo run: remove it or pass another out "
                                              r"\(--out\)$"):
        demo.run_demo(tmp_path / "out", cfg=demo.DemoConfig.quick())
