"""Objective.uses_every_parameter: where it answers True (DDP then skips its search for unused parameters,
train.distributed.wrap), a few tiny steps, short texts among them, leave no trainable parameter without a
gradient, on every distinct tiny preset the objective trains."""
from functools import lru_cache

import pytest
import torch

import lmforge
from lmforge import objectives
from lmforge.data.stream import build_examples
from lmforge.data.synthetic import documents
from lmforge.heads import make_head
from lmforge.model import from_config
from lmforge.objectives import MaskedLM
from lmforge.objectives.distilbert import Distillation
from lmforge.presets import ELMO_PRESETS, PRESETS, tiny
from lmforge.train.pretrain import sized_to, tokenize_documents
from lmforge.train.tokenizer_run import default_tokenizer
from lmforge.utils.errors import OptionsError

DOCS = list(documents(24, seed=0))
MAX_LEN = 32


def distinct_presets() -> dict:
    """One preset per distinct tiny config (bert-tiny .. bert-large are one), by architecture."""
    kept: dict = {}
    for name in [*PRESETS, *ELMO_PRESETS]:
        cfg = tiny(name)
        same = [n for n in kept.get(cfg.architecture, []) if tiny(n) == cfg]
        if not same:
            kept.setdefault(cfg.architecture, []).append(name)
    return kept


PRESETS_OF = distinct_presets()


@lru_cache(maxsize=None)
def tokenizer_of(family: str):
    """A tokenizer of the family trained on the built-in corpus, as pretrain trains one."""
    return default_tokenizer(family, DOCS, 300)


def built(name: str, preset: str) -> tuple:
    """(objective, examples) of `name` around a tiny `preset` model, as pretrain builds them."""
    spec = objectives.get(name)
    tokenizer = tokenizer_of(spec.tokenizer)
    cfg = sized_to(tiny(preset), tokenizer, None, lambda *args: None)
    torch.manual_seed(0)
    model = from_config(cfg)
    if spec.teacher:  # a teacher with its masked-LM head, which the objective distils from
        model.add_head("lm", make_head(model, "lm"))
    ids = tokenize_documents(tokenizer, DOCS, spelled=spec.tokenizer == "words")
    examples = build_examples(spec.examples, ids, tokenizer, MAX_LEN, 0, spec.options)
    return spec.make(model, tokenizer), examples


def batches(objective, examples: list) -> list:
    """Two batches of four examples, then the first four cut to 1 and 2 tokens: nothing to mask, predict
    or shuffle (what leaves a head idle where one can be)."""
    cut = [[{k: v[:n] if isinstance(v, list) else v for k, v in e.items() if isinstance(v, (list, int))}
            for e in examples[:4]] for n in (1, 2)]
    groups = [examples[:4], examples[4:8], *cut]
    seeded = torch.Generator().manual_seed
    return [objective.collate([objective.corrupt(e, seeded(7 * i + j)) for j, e in enumerate(g)])
            for i, g in enumerate(groups)]


def idle_after_step(objective, batch: dict) -> list:
    """The trainable parameters whose .grad is None after one forward and backward of `batch`."""
    objective.zero_grad(set_to_none=True)
    objective(batch).loss.backward()
    return [n for n, p in objective.named_parameters() if p.requires_grad and p.grad is None]


def fitting(name: str, among: dict = PRESETS_OF) -> list:
    """The presets of `among` (by architecture) that objective `name` trains: those its spec's check passes
    (the refusal pretrain and a bake-off plan make: RoBERTa's one segment type for sentence pairs, ...)."""
    spec = objectives.get(name)
    found = []
    for architecture in spec.architectures:
        for preset in among.get(architecture, []):
            try:
                spec.check(tiny(preset), preset)
            except OptionsError:
                continue
            found.append(preset)
    return found


# each objective on these (BERT; ALBERT's shared layers and ELECTRA-Small's factorised embeddings, which a
# generator shares; T5's and BART's stacks), and every distinct tiny preset under one plain objective
SOME = {"encoder": ["bert-base", "albert-base", "electra-small"], "decoder": ["gpt2"],
        "encoder-decoder": ["t5-small", "bart-base"], "elmo": ["elmo-small"]}
PLAIN = {"encoder": "mlm", "decoder": "clm", "encoder-decoder": "span-corruption", "elmo": "bilm"}


def idle_where_said(name: str, presets: list) -> dict:
    """Per preset where objective `name` says every step uses every parameter, those a step left idle."""
    found = {}
    for preset in presets:
        try:
            objective, examples = built(name, preset)
        except ValueError:
            continue  # a model this objective refuses to build around (an ALBERT teacher: shared layers)
        if objective.uses_every_parameter():
            objective.train()
            found[preset] = [n for b in batches(objective, examples) for n in idle_after_step(objective, b)]
    return found


# the audit: which built-in objectives say so on the first tiny preset of each architecture they train
SAYS = {"mlm": True, "wwm": True, "nsp": True, "sop": True, "structural": True, "distillation": True,
        "span-mlm": True, "all-tokens-mlm": True, "rtd": True, "clm": True, "span-corruption": True,
        "denoising": True, "t5-bert-style": True, "t5-deshuffling": True, "bilm": True, "bilm-sampled": True,
        "span": False, "replace-mlm": False, "plm": False}
SAYS_BY_ARCHITECTURE = {("prefix-lm", "decoder"): False, ("prefix-lm", "encoder-decoder"): True}


@pytest.mark.parametrize("name", objectives.names())
def test_every_step_reaches_every_parameter_where_the_objective_says_so(name):
    found = idle_where_said(name, fitting(name, SOME))
    assert all(idle == [] for idle in found.values()), found


@pytest.mark.parametrize("architecture", sorted(PLAIN))
def test_every_distinct_tiny_preset_body_is_reached_where_said(architecture):
    found = idle_where_said(PLAIN[architecture], PRESETS_OF[architecture])
    assert found and all(idle == [] for idle in found.values()), found


@pytest.mark.parametrize("name", sorted({*SAYS, *(n for n, _ in SAYS_BY_ARCHITECTURE)}))
def test_the_built_in_objectives_say_what_the_audit_found(name):
    spec = objectives.get(name)
    for architecture in spec.architectures:
        preset = next(p for p in fitting(name) if tiny(p).architecture == architecture)
        expected = SAYS[name] if name in SAYS else SAYS_BY_ARCHITECTURE[(name, architecture)]
        assert built(name, preset)[0].uses_every_parameter() is expected, (name, preset)


def test_a_head_the_objective_does_not_train_or_xlnet_attention_keeps_the_search():
    torch.manual_seed(0)
    model = lmforge.build(tiny("bert-base"))
    assert MaskedLM(model, mask_id=3, special_ids=(1, 2)).uses_every_parameter()
    # a converted checkpoint's NSP head, which masked LM alone never reads
    model.add_head("nsp", make_head(model, "classification", n_labels=2))
    assert not MaskedLM(model, mask_id=3, special_ids=(1, 2)).uses_every_parameter()
    model.heads["nsp"].requires_grad_(False)  # frozen: DDP reduces no gradient of it
    assert MaskedLM(model, mask_id=3, special_ids=(1, 2)).uses_every_parameter()
    xlnet = lmforge.build(tiny("xlnet-base"))  # its query stream's start idles outside permutation LM
    assert not MaskedLM(xlnet, mask_id=3, special_ids=(1, 2)).uses_every_parameter()



@pytest.mark.parametrize("n_global_tokens, says", [(1, True), (0, False)])
def test_longformer_global_projections_without_a_global_token_keep_the_search(n_global_tokens, says):
    """n_global_tokens=0 (allowed) leaves no token global: global_qkv idles on every step, which said True
    stopped a DDP run without the search at its second step; a default global [CLS] reads it each step."""
    torch.manual_seed(0)
    cfg = tiny("longformer-base", n_global_tokens=n_global_tokens)
    objective = MaskedLM(lmforge.build(cfg), mask_id=3, special_ids=(1, 2))
    batch = objective.collate([objective.corrupt({"input_ids": [1, *range(5, 20), 2]},
                                                 torch.Generator().manual_seed(0))] * 2)
    idle = idle_after_step(objective, batch)
    assert cfg.global_projections and (idle == []) is says, idle
    assert objective.uses_every_parameter() is says

def test_a_frozen_teacher_does_not_count_but_a_student_copy_of_its_other_head_does():
    torch.manual_seed(0)
    teacher = lmforge.build(tiny("bert-base"))
    teacher.add_head("lm", make_head(teacher, "lm"))
    assert Distillation.build(teacher, FakeVocabulary(teacher)).uses_every_parameter()
    teacher.add_head("nsp", make_head(teacher, "classification", n_labels=2))
    assert not Distillation.build(teacher, FakeVocabulary(teacher)).uses_every_parameter()


class FakeVocabulary:
    """What Distillation.build reads of a tokenizer: its size and special ids."""

    def __init__(self, model) -> None:
        self.vocab_size = model.config.vocab_size

    def special_id(self, role: str):
        return {"pad": 0, "cls": 1, "sep": 2, "mask": 3}.get(role)
