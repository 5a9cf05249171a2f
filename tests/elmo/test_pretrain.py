"""ELMo's biLM pretraining through `lmforge pretrain` on the built-in corpus: both directions'
perplexities fall, and a run killed after a checkpoint resumes to the same weights bit for bit."""
import shutil

import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.objectives.bilm import BiLM, sentence_examples
from lmforge.tokenizer import load_tokenizer
from lmforge.train.log import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY = ["lstm_dim=64", "d_model=32", "char_filters=[[1,8],[2,8],[3,16]]", "char_embed_dim=8", "batch_size=8",
        "progress=false", "lr=3e-3", "warmup=2", "max_len=24", "dropout=0"]


def pretrain(out, steps: int, *extra) -> list:
    return ["pretrain", "--preset", "elmo-small", "--objective", "bilm", "--out", str(out),
            "--steps", str(steps), *TINY, *extra]


def held_out_perplexities(model, tokenizer, sentences: list) -> tuple:
    """(forward, backward) full-softmax perplexities of `model` on `sentences` (lists of word ids)."""
    objective = BiLM.build(model, tokenizer).eval()
    batch = objective.collate(sentence_examples([sentences], tokenizer, 24))
    with torch.no_grad():
        metrics = objective(batch).metrics
    return float(metrics["forward_perplexity"]), float(metrics["backward_perplexity"])


@pytest.mark.slow  # an end-to-end pretraining run
def test_both_perplexities_fall_on_the_builtin_corpus(tmp_path):
    # 20 steps on 300 documents (all 2,000 took four times as long): both perplexities fell to 0.17 and 0.28
    # of step 5's by step 20, and held out to 0.23 and 0.30 of the untrained model's (2,000: 0.16 and 0.28)
    assert main(pretrain(tmp_path, 20, "log_every=5", "n_docs=300")) == 0
    logged = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in logged] == [5, 10, 15, 20]
    for direction in ("forward_perplexity", "backward_perplexity"):
        first, last = logged[0][direction], min(r[direction] for r in logged[-2:])
        assert last < 0.5 * first, (direction, first, last)
    model, tokenizer = lmforge.load(tmp_path / "final"), load_tokenizer(tmp_path / "final")
    assert "softmax" in model.heads and model.config.vocab_size >= tokenizer.vocab_size
    text = ["Tosk is a city on the river .", "The river runs to the sea ."]
    sentences = [tokenizer.encode(t).ids for t in text]
    trained = held_out_perplexities(model, tokenizer, sentences)
    torch.manual_seed(0)
    model.reset_parameters()  # the same model untrained (its softmax kept): both directions were learnt
    untrained = held_out_perplexities(model, tokenizer, sentences)
    assert trained[0] < 0.5 * untrained[0] and trained[1] < 0.5 * untrained[1], (trained, untrained)


@pytest.mark.parametrize("stateful", ["false", "true"])
def test_a_killed_run_resumes_exactly(tmp_path, stateful):
    """Stateful: the checkpoint keeps the LSTM states the next batch starts from (Objective.carried)."""
    full, killed = tmp_path / "full", tmp_path / "killed"
    # 4 steps, a checkpoint after 2 (the resumed half trains as long as the half before it; 8 steps took
    # a third longer and checked nothing more)
    run = ("save_every=2", "log_every=1", f"stateful={stateful}", "n_docs=100")  # 100 documents: enough
    assert main(pretrain(full, 4, *run)) == 0
    shutil.copytree(full, killed)  # the same run's folder (a second identical run took a third of the time)
    shutil.rmtree(killed / "checkpoints" / "step-0000004")  # killed after the checkpoint of step 2
    shutil.rmtree(killed / "final")
    assert main(pretrain(killed, 4, *run, "--resume")) == 0
    a, b = lmforge.load(full / "final").state_dict(), lmforge.load(killed / "final").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in read_metrics(killed / "metrics.jsonl")] == list(range(1, 5))
    assert [r["loss"] for r in read_metrics(killed / "metrics.jsonl")] == \
        [r["loss"] for r in read_metrics(full / "metrics.jsonl")]


def test_a_callers_evaluator_ends_a_bilm_run_early_with_its_final_model(tmp_path):
    from lmforge.train import TrainConfig
    from lmforge.train.pretrain import pretrain as run

    text = tmp_path / "corpus.txt"
    text.write_text("the dog sleeps .\n\nthe cat runs to the dog .\n\na dog sees the cat .\n")
    seen = []

    def stop_at_three(trainer) -> dict:  # as a wall-clock deadline would, once it has passed
        seen.append(trainer.step)
        return {"stop": True} if trainer.step >= 3 else {}

    train = TrainConfig(steps=10, batch_size=2, eval_every=1, eval_batches=1, log_every=1, progress=False,
                        device="cpu")
    sizes = {"lstm_dim": 16, "d_model": 8, "char_filters": [[1, 4], [2, 4]], "char_embed_dim": 4}
    model = run("bilm", tmp_path / "run", train, preset="elmo-small", data=[str(text)],
                overrides={**sizes, "vocab_size": 50}, max_len=12, log=lambda *a: None,
                evaluator=stop_at_three)
    assert seen == [1, 2, 3]
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3]
    saved = lmforge.load(tmp_path / "run" / "final").state_dict()
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_evaluating_a_stateful_bilm_is_reproducible_and_keeps_the_training_states():
    """bilm-tf evaluates a model of its own: an evaluation batch starts from zero states (its loss does not
    hang on what ran before) and the training stream's carried states are those training left."""
    from lmforge.tokenizer.chars import train_words

    torch.manual_seed(0)
    model = lmforge.build(lmforge.tiny("elmo-small", stateful=True, dropout=0.0))
    tokenizer = train_words(["the dog sleeps . a cat runs ."], 20)
    objective = BiLM.build(model, tokenizer)
    texts = ("the dog sleeps .", "a cat runs .")
    batch = objective.collate([{"input_ids": tokenizer.encode(t).ids} for t in texts])
    with torch.no_grad():
        stateless = float(objective.eval()(batch).loss)
        objective.train()(batch)  # a training batch: its final states are carried
        carried = [[h.clone() for h, _ in direction] for direction in model.states]
        evaluated = [float(objective.eval()(batch).loss) for _ in range(2)]
    assert evaluated == [stateless, stateless]
    assert all(torch.equal(h, kept) for direction, kept_direction in zip(model.states, carried)
               for (h, _), kept in zip(direction, kept_direction))


def test_a_run_feeds_a_word_outside_the_vocabulary_its_own_characters():
    """Pretraining from text keeps an <UNK> word's spelling: the character CNN reads "zyzzyva", the
    softmax's target is <UNK> (bilm-tf); an in-vocabulary sentence's example is its ids alone."""
    from lmforge.objectives import registry
    from lmforge.tokenizer.chars import train_words, word_chars
    from lmforge.train.pretrain import _examples

    docs = [["the cat sat .", "the cat ran ."]] * 10 + [["the zyzzyva sat ."]]  # seen once: not a word
    tokenizer = train_words([s for d in docs for s in d], 9)  # one id short of zyzzyva
    train, held = _examples(registry.get("bilm"), None, docs, tokenizer, 24, 0, log=lambda *a: None)
    spelled = [e for e in train + held if "oov" in e]
    assert [e["oov"] for e in spelled] == [{2: "zyzzyva"}]
    model = lmforge.build(lmforge.tiny("elmo-small", vocab_size=tokenizer.vocab_size))
    batch = BiLM.build(model, tokenizer).collate(spelled[:1])
    width = model.config.max_characters_per_token
    assert batch["char_ids"][0, 2].tolist() == word_chars("zyzzyva", width)
    assert batch["input_ids"][0, 2] == tokenizer.special_id("unk")


def test_a_run_from_shards_feeds_the_characters_a_run_from_the_same_text_does(tmp_path):
    """Word shards keep their <UNK> words' spellings: the biLM's examples from shards are those from the
    same text, spellings and all, and "zyzzyva" reaches the character CNN as its own characters."""
    from lmforge.data.shards import shard_corpus
    from lmforge.data.stream import ShardCorpus
    from lmforge.objectives import registry
    from lmforge.tokenizer.chars import train_words, word_chars
    from lmforge.train.pretrain import _examples, read_documents

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(["the cat sat .\nthe cat ran ."] * 10 + ["the zyzzyva sat ."]))
    docs = read_documents([corpus])
    tokenizer = train_words([s for d in docs for s in d], 9)  # one id short of zyzzyva
    shard_corpus([corpus], tokenizer, tmp_path / "s", log=lambda m: None)
    spec, quiet = registry.get("bilm"), lambda *a: None
    from_text = _examples(spec, None, docs, tokenizer, 24, 0, log=quiet)
    from_shards = _examples(spec, ShardCorpus(tmp_path / "s"), None, tokenizer, 24, 0, log=quiet)
    every = [[e for part in run for e in part] for run in (from_text, from_shards)]  # train and held out
    assert sorted(map(repr, every[1])) == sorted(map(repr, every[0]))
    spelled = [e for e in every[1] if "oov" in e]
    assert [e["oov"] for e in spelled] == [{2: "zyzzyva"}]
    model = lmforge.build(lmforge.tiny("elmo-small", vocab_size=tokenizer.vocab_size))
    batch = BiLM.build(model, tokenizer).collate(spelled)
    assert batch["char_ids"][0, 2].tolist() == word_chars("zyzzyva", model.config.max_characters_per_token)
