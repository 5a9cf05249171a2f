"""Every bench script that writes a result names the machine it ran on, through bench.common.machine."""
import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"

# scripts whose source holds JSON but which write no measured result, and why
NOT_RESULTS = {
    "common.py": "defines machine() itself",
    "report.py": "reads the results, measures nothing",
    "pruning_summary.py": "tabulates other scripts' results, measures nothing",
    "rag_generator.py": "writes a corpus, not a result",
    "serve_client.py": "JSON request bodies sent to the server",
    "attention.py": "a child's one measurement, printed to bench.run, which names the machine",
    "training.py": "a child's one measurement, printed to bench.run, which names the machine",
}


def _writers() -> list:
    """The bench scripts that write (or print) a JSON result."""
    return sorted(p for p in BENCH.glob("*.py")
                  if "json.dump" in p.read_text() and p.name not in NOT_RESULTS)


def _uses_shared_machine(tree: ast.AST) -> bool:
    """`from bench.common import machine` somewhere in the module, and a call machine()."""
    imported = any(isinstance(n, ast.ImportFrom) and n.module == "bench.common"
                   and any(a.name == "machine" and a.asname is None for a in n.names) for n in ast.walk(tree))
    called = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "machine"
                 for n in ast.walk(tree))
    return imported and called


def test_every_result_writer_records_the_machine_through_the_shared_helper():
    """finetune_minilm and prune_speed named no machine; retrieval and rerank only "x86_64"."""
    writers = _writers()
    assert {"finetune_minilm.py", "prune_speed.py", "retrieval.py", "rerank.py"} <= {p.name for p in writers}
    missing = [p.name for p in writers if not _uses_shared_machine(ast.parse(p.read_text()))]
    assert missing == []


def test_no_script_keeps_its_own_copy_of_the_machine_helper():
    """One description of the machine: a second machine() or a platform.processor() 'cpu' drifts apart."""
    copies = [p.name for p in BENCH.glob("*.py") if p.name != "common.py"
              and any(isinstance(n, ast.FunctionDef) and n.name == "machine"
                      for n in ast.walk(ast.parse(p.read_text())))]
    assert copies == []
    assert not [p.name for p in BENCH.glob("*.py") if "platform.processor()" in p.read_text()
                and '"cpu"' in p.read_text()]


def test_the_machine_names_the_processor_model():
    """Not just the architecture ("x86_64"), and without the dev extras' transformers if need be."""
    from bench.common import cpu_name, machine

    found = machine()
    assert found["cpu"] == cpu_name() and {"cores", "threads", "torch", "transformers"} <= set(found)
