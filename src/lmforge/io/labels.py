"""What a classifier's outputs are called, kept from the folder a model was loaded from to the Hugging Face
config it is saved as: id2label / label2id, problem_type and a CrossEncoder's activation_fn, written by
`lmforge.save(model, d, format="hf")` and so by `lmforge convert --to hf`.

A model directory says them in its task.json (a fine-tuned model's "labels", "kind" and "activation"; a
converted reference checkpoint's "labels", "id2label", "problem_type" and "activation") or, a Hugging Face
one without task.json, in its config.json (id2label, problem_type, a sentence-transformers CrossEncoder's
activation_fn). `load` keeps them on the model's classifier head (`head.head_labels`), so a head put in its
place is not named by them.

The label helpers that tasks/reference.py reads a Hugging Face config with live here too (tasks import io,
never the other way): what a label is, an id2label's output order, the valid problem_types, and the
activation a CrossEncoder's config names for its score.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lmforge.config.checks import ConfigError
from lmforge.config.options import OptionsError
from lmforge.io.files import CheckpointError
from lmforge.io.native import FORMAT, read_json_object
from lmforge.utils.model_folder import check_recorded
from lmforge.utils.errors import shown

TASK_FILE = "task.json"
# the values of a Hugging Face config's problem_type (transformers' ForSequenceClassification)
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
# the reference's problem_type of each lmforge task kind whose outputs it would otherwise misread (a
# multilabel head as one softmax, a regression as classes)
KIND_PROBLEM_TYPE = {"multilabel": "multi_label_classification", "regression": "regression",
                     "rerank": "regression"}
# a CrossEncoder's score: the logit's sigmoid, or the logit as it is; the class sentence-transformers names
ACTIVATION_FNS = {"sigmoid": "torch.nn.modules.activation.Sigmoid",
                  "identity": "torch.nn.modules.linear.Identity"}
ACTIVATIONS = tuple(ACTIVATION_FNS)


@dataclass(frozen=True)
class HeadLabels:
    """A classifier's label names in output order (None: unknown) and its reference problem_type."""

    names: tuple | None = None
    problem_type: str | None = None
    activation: str | None = None  # a CrossEncoder's (ACTIVATIONS, or a class named), its activation_fn
    # the folder is (or descends from) a sentence-transformers CrossEncoder: its activation, identity too, is
    # exported, as sentence-transformers would otherwise read a sigmoid
    cross_encoder: bool = False


def is_label(value) -> bool:
    """Whether `value` can be a label: text or a number (no list, object, null, bool)."""
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def id2label_order(where, id2label: dict, error=ValueError) -> list:
    """The labels of an id2label, in output order; `error` naming `where` where a key is no output number, a
    value no label, or the numbers skip one (the reference then has no name for an output)."""
    if not all(str(k).isdigit() for k in id2label):
        raise error(f"{where}: id2label keys must be label numbers, got {sorted(id2label)[:3]}")
    if not all(map(is_label, id2label.values())):
        raise error(f"{where}: id2label values must be label names, got {shown(list(id2label.values()))}")
    numbers = sorted(int(k) for k in id2label)
    if numbers != list(range(len(numbers))):
        raise error(f"{where}: id2label keys must be the outputs 0..{len(numbers) - 1}, got "
                    f"{numbers[:6]}: an output would have no label")
    return [id2label[k] for k in sorted(id2label, key=int)]


def cross_encoder(hf: dict) -> str | None:
    """The config field by which `hf` is a sentence-transformers CrossEncoder's (v4+, or older), or None."""
    block = hf.get("sentence_transformers")
    if isinstance(block, dict):  # written by CrossEncoder.save alone, its activation_fn in it or not
        return "sentence_transformers activation_fn" if "activation_fn" in block else "sentence_transformers"
    return "sbert_ce_default_activation_function" if hf.get("sbert_ce_default_activation_function") else None


def n_labels(hf: dict) -> int:
    """A reference config's number of outputs as transformers counts it: id2label's, else num_labels,
    else 2; a ConfigError naming num_labels where it is no positive integer."""
    id2label = hf.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    n = hf.get("num_labels")
    if n is None:  # absent or null: the reference's default
        return 2
    if type(n) is not int or n < 1:  # the reference refuses these too ("3", 3.0, true)
        raise ConfigError(f"num_labels must be a positive integer, got {shown(n)}", "num_labels")
    return n


def cross_encoder_activation(where, hf: dict) -> str | None:
    """The activation a CrossEncoder's config `hf` (the file `where`) names for its scores, as
    sentence-transformers reads it (sentence_transformers.activation_fn, or the older
    sbert_ce_default_activation_function; none or null: its default, sigmoid for one output, identity for
    more): one of ACTIVATIONS, else the class named (a Tanh), kept so that the folder converts and exports as
    it came, and refused only where it scores (scoring_activation); None for no CrossEncoder's config."""
    if not cross_encoder(hf):
        return None
    block = hf.get("sentence_transformers")
    if isinstance(block, dict) and "activation_fn" in block:  # the block's key, null too, before the old one
        named = block["activation_fn"]
    else:
        named = hf.get("sbert_ce_default_activation_function")
    if named is None:  # CrossEncoder.get_default_activation_fn: by its number of labels
        return "sigmoid" if n_labels(hf) == 1 else "identity"
    kind = str(named).rsplit(".", 1)[-1].lower()
    return kind if kind in ACTIVATIONS else str(named)[:200]


def known_activation(activation) -> bool:
    """Whether lmforge scores with `activation`: None (the task's default) or one of ACTIVATIONS. The one
    membership test; each caller raises its own error (an option's OptionsError, a file's ValueError)."""
    return activation is None or activation in ACTIVATIONS


def scoring_activation(where, activation: str | None, error=ValueError) -> str | None:
    """`activation` where a task scores with it: None or one of ACTIVATIONS; another (a CrossEncoder's Tanh)
    is `error` naming `where`."""
    if known_activation(activation):
        return activation
    raise error(f"{where}: activation_fn {str(activation)[:60]!r} is not supported (lmforge scores with "
                "torch.nn.Sigmoid or torch.nn.Identity)")


def exported_activation(info: dict) -> str | None:
    """The activation a task's export names as a CrossEncoder's activation_fn (`info`: its task.json, or a
    task's kind, activation and cross_encoder): a reranker's, a sigmoid regression's (not what a reader of a
    regression infers), a converted CrossEncoder's or one descended from a CrossEncoder (identity too); None
    for a plain regressor (identity), which the marker would make a reader of pairs."""
    activation = info.get("activation")
    crossed = (info.get("kind") == "rerank" or "rerank" in (info.get("kinds") or ())
               or activation == "sigmoid" or info.get("cross_encoder") is True)
    return activation if crossed else None


def _names(where, value, field: str, mapping: bool = False) -> tuple | None:
    """`value` (a list, or with `mapping` a config's {"0": name, ...}) as label names in output order (text
    or numbers, said as text), or CheckpointError naming the field."""
    if value is None:
        return None
    if mapping and isinstance(value, dict):
        value = id2label_order(where, value, CheckpointError)
    if not (isinstance(value, list) and all(map(is_label, value))):
        raise CheckpointError(f"{where}: \"{field}\" must be a list of labels (text or numbers), "
                              f"not {shown(value)}")
    return tuple(map(str, value)) or None


def task_fields(where, info: dict) -> dict:
    """task.json's "kind" (text) and "kinds" (a list of text) as exported_activation and task_info read
    them, or CheckpointError naming the file (a number there was a raw TypeError on load)."""
    kind, kinds = info.get("kind"), info.get("kinds")
    if kind is None and kinds is None:  # every writer names one; "kind": null had read as no task.json at all
        said = "null" if "kind" in info else "missing"
        raise CheckpointError(f"{where}: \"kind\" is {said}: a task.json names its task kind (or a reference "
                              f"head's \"kinds\")")
    if kind is not None and not isinstance(kind, str):
        raise CheckpointError(f"{where}: \"kind\" must be a task kind, not {shown(kind)}")
    if kinds is not None and not (isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)):
        raise CheckpointError(f"{where}: \"kinds\" must be a list of task kinds, not {shown(kinds)}")
    return info


def read_labels(path: Path, meta: dict) -> HeadLabels | None:
    """The labels and problem_type a model directory states (task.json first, else a Hugging Face
    config.json's), or None where it states none; CheckpointError naming the file where they are damaged."""
    if (path / TASK_FILE).is_file() or meta.get("format") == FORMAT:
        check_recorded(path, TASK_FILE, CheckpointError)  # changed or lost since its job wrote it
        if not (path / TASK_FILE).is_file():
            return None
        where = path / TASK_FILE
        info = task_fields(where, read_json_object(where))
        names = _names(where, info.get("labels"), "labels") or _names(where, info.get("id2label"), "id2label")
        problem = info["problem_type"] if "problem_type" in info else KIND_PROBLEM_TYPE.get(info.get("kind"))
        activation, crossed = exported_activation(info), info.get("cross_encoder") is True
        if activation is not None and not isinstance(activation, str):  # another name: exported as it came
            raise CheckpointError(f"{where}: activation must be text, not {shown(activation)}")
    else:
        where = path / "config.json"
        names, problem = _names(where, meta.get("id2label"), "id2label", True), meta.get("problem_type")
        activation = cross_encoder_activation(where, meta)
        crossed = cross_encoder(meta) is not None
    if problem is not None and not isinstance(problem, str):
        raise CheckpointError(f"{where}: problem_type must be text, not {shown(problem)}")
    return HeadLabels(names, problem, activation, crossed) if names or problem or activation else None


def classifier(model):
    """The model's classifier head (the first with n_labels), or None without one."""
    heads = getattr(model, "heads", {})
    return next((h for h in heads.values() if "n_labels" in getattr(h, "spec", {})), None)


def n_outputs(model) -> int | None:
    """The number of outputs of the model's classifier head, or None without one."""
    head = classifier(model)
    return None if head is None else head.spec["n_labels"]


def attach(model, path: Path, meta: dict) -> None:
    """Keep `path`'s labels on `model`'s classifier head (load calls this): on the head, so that a head put
    in its place (fine-tuned on other labels) is not named by them. Damaged ones are kept as their error,
    raised when the model is saved as a Hugging Face classifier: a model loaded to embed is not refused."""
    head = classifier(model)
    if head is None:
        return
    try:
        head.head_labels = read_labels(path, meta)
    except CheckpointError as err:
        head.head_labels = err


def _checked(labels, n: int | None) -> tuple:
    """`labels` given to save, checked: a list of non-empty, unique strings, one per output of the head."""
    if isinstance(labels, (str, bytes)) or not isinstance(labels, (list, tuple)):
        raise OptionsError(f"labels must be a list of label names, got {type(labels).__name__}", "labels")
    if not all(isinstance(x, str) and x for x in labels):
        raise OptionsError(f"labels must be non-empty strings, got {shown(list(labels))}", "labels")
    if len(set(labels)) != len(labels):
        raise OptionsError(f"labels must be unique, got {shown(list(labels))}", "labels")
    if n is None or len(labels) != n:
        has = "no classifier head" if n is None else f"a classifier head of {n} outputs"
        raise OptionsError(f"labels: {len(labels)} given, but the model has {has}", "labels")
    return tuple(labels)


def labels_to_write(model, labels) -> HeadLabels | None:
    """The labels a Hugging Face export of `model` names its outputs by: `labels` given (checked: text,
    unique, one per output of its classifier head) with the problem_type it was loaded with, else those
    it was loaded with where their count fits its head (a head of another size is not the one they named:
    nothing of them is kept); None (LABEL_i) where none are known."""
    n = n_outputs(model)
    given = None if labels is None else _checked(labels, n)
    known = getattr(classifier(model), "head_labels", None)
    if isinstance(known, CheckpointError):
        if given is None:
            raise known
        known = None
    if given is not None:
        return HeadLabels(given, known.problem_type, known.activation) if known else HeadLabels(given)
    if known is None or (known.names and len(known.names) != n):
        return None
    return known
