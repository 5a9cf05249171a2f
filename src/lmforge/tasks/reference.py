"""What a Hugging Face fine-tuned checkpoint's config.json says its head means, read as the reference
reads it (transformers' ForSequenceClassification and text-classification pipeline):

- problem_type "regression", or none with one output (num_labels 1): the score is the value, raw, or a
  CrossEncoder's through its activation_fn (lmforge's regression task, or a cross-encoder's rerank
  score); a multi-output regression is refused;
- problem_type "single_label_classification", or none with two or more outputs: the argmax of the
  outputs, named by id2label (cls or pair);
- problem_type "multi_label_classification": a sigmoid per label, any number of them true, named by
  id2label (lmforge's multilabel task);
- ForTokenClassification: a tagging task, its tags named by id2label.
Without id2label (transformers 5 saves default labels as num_labels alone) the outputs are the class
ids 0..n-1 (default_labels). A sentence-transformers CrossEncoder's config (its "sentence_transformers"
activation_fn, or an older one's sbert_ce_default_activation_function) says it scores text pairs: its
one output is a rerank score, its classes a pair task's.

task_info returns the labels and, for such a checkpoint, "kinds" (the tasks its head may be read as),
"why" (the config field that decides it), a CrossEncoder's "activation" and "cross_encoder", which
fine_tuned_task checks. task_file writes the same
as task.json where `lmforge convert` brings such a checkpoint into lmforge's format.
"""
from __future__ import annotations

from pathlib import Path

from lmforge.io import model_dir

# the label helpers live in io/labels.py (io.load reads them too), their one home: import them from there
from lmforge.io.labels import (ACTIVATIONS, PROBLEM_TYPES, TASK_FILE, cross_encoder, cross_encoder_activation,
                               id2label_order, is_label, scoring_activation, task_fields)
from lmforge.io.native import FORMAT, CheckpointError, read_json_object
from lmforge.tasks.base import MODULES, task_class
from lmforge.utils.model_folder import check_recorded, inside_job_folder
from lmforge.utils.errors import shown

ONE_SCORE = ["regression", "rerank"]
CLASSES = ["cls", "pair"]
MULTI = ["multilabel"]
# a CrossEncoder's (its config says it reads text pairs): one score ranks (ms-marco's) or regresses (an STS
# model's: lmforge's regression reads text_pair too), served as a reranker; classes are a pair task's
PAIR_SCORE, PAIR_CLASSES = ["rerank", "regression"], ["pair"]


def _sequence_head(config: Path, hf: dict, labels: list | None) -> dict:
    """task_info's fields of a ForSequenceClassification config: its labels, kinds and why."""
    problem = hf.get("problem_type")
    if problem is not None and problem not in PROBLEM_TYPES:
        raise ValueError(f"{config}: problem_type {shown(problem)} is not one of {', '.join(PROBLEM_TYPES)}")
    n = len(labels) if labels else hf.get("num_labels", 2)
    where = f"{config.name}'s problem_type {problem!r}" if problem else f"{config.name}'s num_labels {n}"
    if problem == "multi_label_classification":
        return {"labels": labels, "outputs": None if labels else n, "kinds": MULTI,
                "why": f"{where} (a sigmoid per label, any number of them true)"}
    pairs = cross_encoder(hf)
    if pairs:  # a CrossEncoder scores text pairs: cls and a plain regression are not what it reads
        where = f"{where} and {pairs} (a CrossEncoder: it reads text pairs)"
    if problem == "regression" or (problem is None and n == 1):
        if n != 1:
            return {"kinds": [], "why": f"{where} with num_labels {n} ({n} raw scores) is a task lmforge "
                                        "does not have: its regression task has one output"}
        # a CrossEncoder's score is read through its activation, as CrossEncoder.predict reads it
        return {"kinds": PAIR_SCORE if pairs else ONE_SCORE, "why": f"{where} (one raw score)",
                "activation": cross_encoder_activation(config, hf), "cross_encoder": True if pairs else None}
    return {"labels": labels, "outputs": None if labels else n, "kinds": PAIR_CLASSES if pairs else CLASSES,
            "why": f"{where} (the argmax of the outputs)"}


def reference_task(config: Path, hf: dict) -> dict:
    """task_info's fields of a Hugging Face config.json `hf` (see the module docstring); {} for a head
    of another kind (its labels only, where id2label names them)."""
    id2label = hf.get("id2label")
    labels = id2label_order(config, id2label) if isinstance(id2label, dict) and id2label else None
    architectures = hf.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures else ""
    if not isinstance(name, str):
        name = ""
    if name.endswith("ForSequenceClassification"):
        info = _sequence_head(config, hf, labels)
    elif name.endswith("ForTokenClassification"):  # a softmax per token, whatever its problem_type
        info = {"labels": labels, "outputs": None if labels else hf.get("num_labels", 2),
                "kinds": ["tagging"], "why": f"{config.name}'s architectures {shown(name)}"}
    else:
        info = {"labels": labels}
    return {k: v for k, v in info.items() if v is not None}


def own_kind(info: dict) -> str | None:
    """The task kind a task_info says: a task.json's kind, or the one kind a reference head is read as (a
    CrossEncoder's pair or rerank, a token classifier's tagging); None where the data must decide."""
    kinds = info.get("kinds") or ()
    return info.get("kind") or (kinds[0] if len(kinds) == 1 else None)


def saved_kind(model, kind: str | None = None) -> str | None:
    """`kind`, else the one a model folder's own files say (own_kind of its task_info), read without its
    weights: records are checked by it before the model is loaded (an installed model's name reads its own
    folder's). None for a model object, a name that is no model folder (a preset), or a folder that says no
    one kind: the loaded model's task decides, and its loading says what it is."""
    if kind or not isinstance(model, (str, Path)):
        return kind
    found = model_dir(model)
    return own_kind(task_info(found)) if found is not None else None


def fine_tuned_for(info: dict, kind: str) -> bool:
    """Whether a task_info reads as a model fine-tuned for `kind`: its task.json's kind, or one of the kinds
    a reference head is read as (a CrossEncoder's one output: rerank or regression). The one test
    (fine_tuned_task through check_kind, checkpoint_defaults, prune's measure of the source)."""
    return info.get("kind") == kind or kind in (info.get("kinds") or ())


def check_kind(where: str, info: dict, kind: str) -> None:
    """A ValueError naming task.json where it says another kind (cls and pair heads look alike), or the config
    field where a reference checkpoint's head is no `kind` head; none where neither says a kind."""
    if fine_tuned_for(info, kind):
        return
    if info.get("kind", kind) != kind:
        raise ValueError(f"{where} was fine-tuned for {info['kind']}, not {kind} (its task.json)")
    kinds = info.get("kinds")
    if kinds is None:
        return
    if not kinds:
        raise ValueError(f"{where}: {info['why']}")
    raise ValueError(f"{where}: {info['why']} is not a {kind} task; it is read as {' or '.join(kinds)}")


def default_labels(where: str, info: dict, data: list | None) -> list | None:
    """The labels of a reference classifier whose config names none (no id2label: LABEL_i, the class ids):
    the ids "0".."n-1" in output order where the records' labels are among them, LABEL_i without labelled
    records; other labels are refused, the output of each being unknown. None for other models."""
    n = info.get("outputs")
    if n is None:
        return None
    if data is None:
        return [f"LABEL_{i}" for i in range(n)]
    ids = [str(i) for i in range(n)]
    if set(data) <= set(ids):
        return ids  # numeric order: sorted text would put "10" before "2"
    raise ValueError(f"{where}: config.json has no id2label, so its {n} outputs are the class ids "
                     f"0..{n - 1}; the records' labels {data[:3]} are not, and which output is which is "
                     "unknown")


def task_file(config: Path, hf: dict, max_len: int) -> dict | None:
    """The task.json of a reference checkpoint brought into lmforge's format: the head's task kind where
    its config decides one (else the kinds it may be read as, and why), its labels in output order (a
    regressor's id2label), its problem_type as stated, and the model's context as max_len; None for a
    model with no task head (a bare backbone, a language model), whose config states no task."""
    architectures = hf.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures else ""
    if isinstance(name, str) and name.endswith("ForQuestionAnswering"):
        return {"kind": "qa", "max_len": max_len}
    if not (isinstance(name, str) and name.endswith(("ForSequenceClassification", "ForTokenClassification"))):
        return None  # no task head: its config's id2label (a language model's odd one too) is not read
    info = reference_task(config, hf)
    if "kinds" not in info:
        return None
    kinds = info.pop("kinds")
    # one kind: what a fine-tuned model records; two (cls or pair, regression or rerank): the config
    # leaves it to the data, which --task names as for the Hugging Face folder itself; none: why not
    if len(kinds) == 1:
        info["kind"] = kinds[0]
        del info["why"]
    else:
        info["kinds"] = kinds
    id2label = hf.get("id2label")
    if "labels" not in info and isinstance(id2label, dict) and id2label:
        # a regressor's name of its score, for the way back alone: as labels, a cls task would read it
        info["id2label"] = id2label_order(config, id2label)
    return {**info, "problem_type": hf.get("problem_type"), "max_len": max_len}


def _checked_info(file: Path, info: dict) -> dict:
    """task.json's fields that commands read, checked: kind (or a reference head's kinds) task kinds,
    labels a list, max_len > 0, activation a name (ACTIVATIONS, or a CrossEncoder's other one)."""
    task_fields(file, info)  # kind (or kinds) said, as text: "kind": null had read as no task.json
    kind, labels, max_len, kinds = (info.get(name) for name in ("kind", "labels", "max_len", "kinds"))
    if kind is not None and kind not in MODULES:
        raise CheckpointError(f"{file}: \"kind\" {shown(kind)} is not a task kind ({', '.join(MODULES)})")
    if labels is not None and not (isinstance(labels, list) and all(map(is_label, labels))):
        raise CheckpointError(f"{file}: \"labels\" must be a list of labels (text or numbers), not "
                              f"{shown(labels)}")
    if max_len is not None and (type(max_len) is not int or max_len < 1):
        raise CheckpointError(f"{file}: \"max_len\" must be a positive integer, not {shown(max_len)}")
    if kinds is not None and not all(k in MODULES for k in kinds):
        raise CheckpointError(f"{file}: \"kinds\" must be a list of task kinds, not {shown(kinds)}")
    if not isinstance(info.get("cross_encoder", False), bool):
        raise CheckpointError(f"{file}: \"cross_encoder\" must be true or false, not "
                              f"{shown(info['cross_encoder'])}")
    activation = info.get("activation")
    if activation is not None and not (isinstance(activation, str) and 0 < len(activation) <= 200):
        # ACTIVATIONS, or a converted CrossEncoder's other class: refused where it scores (scored_activation)
        raise CheckpointError(f"{file}: \"activation\" must be one of {', '.join(ACTIVATIONS)} (or a "
                              f"CrossEncoder's activation_fn), not {shown(activation)}")
    return info


def scored_activation(path, info: dict) -> str | None:
    """The activation of task_info(`path`) where a task scores with it; a ValueError naming the file where
    lmforge cannot (a CrossEncoder's Tanh): refused there only (evaluate, fine-tuning that keeps it, the
    server's scoring task), so the folder still converts and fine-tunes as a backbone."""
    path = inside_job_folder(Path(path))
    file = path / TASK_FILE if (path / TASK_FILE).is_file() else path / "config.json"
    return scoring_activation(file, info.get("activation"))


def check_scored(path, info: dict, kind: str) -> None:
    """saved_options' refusal of an activation lmforge cannot score `kind` with (a CrossEncoder's Tanh),
    naming the file in the folder `path`; fine_tuned_task and the server (serve/models.py load_served) make it
    before the model's weights are read."""
    if path is not None and "activation" in task_class(kind).options and info.get("activation") is not None:
        scored_activation(path, info)


def saved_heads(path) -> set | None:
    """The head names a model folder's config.json gives its model, read without its weights: lmforge's
    "heads", or those lmforge.convert builds for a Hugging Face architecture (a pooler it may leave out
    included); None where the file says none that is known (the load then says what is wrong)."""
    config = inside_job_folder(Path(path)) / "config.json"
    meta = read_json_object(config) if config.is_file() else {}
    if meta.get("format") == FORMAT:
        heads = meta.get("heads", {})
        return set(heads) if isinstance(heads, dict) else None
    from lmforge.convert.hf import FAMILIES

    family, names = FAMILIES.get(meta.get("model_type")), meta.get("architectures")
    name = names[0] if isinstance(names, list) and names else None
    if family is None or not isinstance(name, str) or name not in family.heads:
        return None
    try:
        return {head for head, _, _ in family.heads[name](meta)}
    except (KeyError, TypeError, ValueError):  # a field the head needs, missing or odd: the load names it
        return None


def _text_to_text(path, kind: str) -> bool:
    """Whether `kind` may be read text-to-text on the folder's model, by its LM head (an encoder-decoder's:
    text2text.choose), its config read without its weights."""
    from lmforge.io import folder_config
    from lmforge.tasks.text2text import KINDS

    return kind in KINDS and folder_config(inside_job_folder(Path(path))).architecture == "encoder-decoder"


def check_head(path, info: dict, kind: str, where: str) -> None:
    """Refuse a model folder whose config.json gives its model no head of `kind`'s task (a backbone never
    fine-tuned, a task.json set beside another model) before its weights are read: the loaded task would
    be refused after (its head freshly drawn, its scores a random head's). fine_tuned_task and the server
    (serve/models.py load_served) make it; a task read by the LM head (text-to-text too) is not checked."""
    head = task_class(kind).head
    heads = None if path is None or head == "lm" else saved_heads(path)
    if heads is None or head in heads or info.get("text_to_text") or _text_to_text(path, kind):
        return
    config = inside_job_folder(Path(path)) / "config.json"
    if info.get("kind") == kind:
        raise CheckpointError(f"{config} gives the model no {head} head, where its {TASK_FILE} says {kind}")
    # a CheckpointError as the other folder refusals, a ValueError: Reranker.load says it as no reranker
    raise CheckpointError(f"{where} was never fine-tuned for {kind}: its config.json has no {head} head (no "
                          f"{TASK_FILE} of that task), so its scores would be a random head's; fine-tune it "
                          f"first (lmforge finetune --task {kind})")


def saved_options(path, info: dict, kind: str, default_len: int) -> dict:
    """The TaskConfig fields (tasks/finetune.py) a folder's task_info `info` says for `kind`: its max_len
    (`default_len` where it says none), text_to_text, prefix and the kind's own options (QA decoding,
    tagging's label_all, a regression's or reranker's activation: one lmforge cannot score with, a
    CrossEncoder's Tanh, which its callers refuse first: check_scored). fine_tuned_task and the server
    (serve/models.py) both rebuild a task so, each with its own default_len."""
    options = {name: info[name] for name in task_class(kind).options if name in info}
    # a task's own options may hold prefix (seq2seq's): one dict, the kind's own last
    return {"max_len": info.get("max_len", default_len), "text_to_text": info.get("text_to_text"),
            "prefix": info.get("prefix"), **options}


def task_info(path) -> dict:
    """A model directory's task.json ({} when absent); a Hugging Face config's labels, the task kinds its
    head may be read as and a CrossEncoder's activation (reference_task). A file that is not JSON, or fields
    of the wrong kind, are one-line errors naming the file. A job's output folder stands for the model
    inside it. The one reading of a folder's task (fine_tuned_task, the server, the reranker)."""
    path = inside_job_folder(Path(path))
    check_recorded(path, TASK_FILE, CheckpointError)  # where config.json records it: changed, or lost
    config = path / "config.json"
    if not (path / TASK_FILE).is_file():
        return reference_task(config, read_json_object(config)) if config.is_file() else {}
    info = _checked_info(path / TASK_FILE, read_json_object(path / TASK_FILE))
    if info.get("kind") in ONE_SCORE and "activation" not in info and config.is_file():
        # a task.json set beside a CrossEncoder's own config (no lmforge job writes one without it)
        found = cross_encoder_activation(config, read_json_object(config))
        info = {**info, "activation": found} if found else info
    return info
