"""pipeline/ is a few packages by concern, layered: a package imports only from packages below it
(or from itself), so nothing low knows anything high — no model knows an experiment, no experiment
knows a stage, the stages know no experiment by name — and the module graph has no cycle (imports
inside functions count too: they hide a cycle, they do not remove it)."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"
# lowest first; a package may import from its own rank's package only if it is itself
LAYERS = [("core",), ("data", "models"), ("report",), ("training",), ("experiments",), ("stages",)]
TOP = ("pipeline", "pipeline.cli", "pipeline.cli_options", "pipeline.warm", "pipeline.profiles")  # the command line, above every package
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(path: Path) -> set[str]:
    """The pipeline modules a file imports anywhere in it (``from pipeline.x import y`` counts as
    pipeline.x.y when that is a module, else pipeline.x)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pipeline":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.split(".")[0] == "pipeline"}
    return names & set(MODULES)


def package_of(module: str) -> str | None:
    """The package a module lives in; None for the command line's top-level modules."""
    return None if module in TOP else module.split(".")[1]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the path, 2 = done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for source, targets in graph.items():
        mine = package_of(source)
        for target in targets:
            theirs = package_of(target)
            if mine is None or theirs == mine:  # the command line may import anything
                continue
            if theirs is None or RANK[theirs] >= RANK[mine]:
                bad.append(f"{source} imports {target}")
    return sorted(bad)


def test_every_module_lives_in_a_layered_package():
    loose = [m for m in MODULES if package_of(m) not in RANK and m not in TOP]
    assert not loose, f"modules outside the layered packages: {loose}"
    assert {package_of(m) for m in MODULES} - {None} <= set(RANK)


def test_no_package_imports_one_above_it_and_no_cycle():
    graph = {name: imports_of(path) - {name} for name, path in MODULES.items()}
    graph = {k: {t for t in v if t != "pipeline"} for k, v in graph.items()}
    assert layering_violations(graph) == []
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    # the checks find what they exist for
    assert layering_violations({"pipeline.models.capsnet": {"pipeline.experiments.table1"}}) == [
        "pipeline.models.capsnet imports pipeline.experiments.table1"]
    assert layering_violations({"pipeline.data.idx": {"pipeline.models.capsnet"}})  # siblings stay apart
    assert layering_violations({"pipeline.core.params": {"pipeline.cli"}})
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_no_stage_names_an_experiment_or_branches_on_image_size():
    from pipeline.core import registry

    names = "|".join(registry.names())
    named = re.compile(rf"\b({names})|table 1|§", re.I)  # an experiment by name, or by the paper's section
    by_size = re.compile(r"image_size\s*(==|!=|in\b|not in)|\b[A-Z]+_SIZE\b|\bCANVAS\b")  # a branch on image size
    for path in (PACKAGE / "stages").glob("*.py"):
        hits = [f"{path.name}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
                if named.search(line) or by_size.search(line)]
        assert not hits, "\n".join(hits)


def test_no_stage_nor_the_gpu_scripts_device_name_imports_scipy_or_torchvision():
    """scipy serves the report's intervals and power alone (imported where they are computed), and
    torchvision `capsnet bench`'s reference loop and the download's public mirrors alone, so a cold
    prepare, train or evaluate process (the GPU window's, a cluster task's) and the GPU scripts' device
    name (scripts/gpu_proof.py, from pipeline.training.bench) do not pay their imports (torchvision's takes
    about 2 s, torch._dynamo's): every stage module, the bench and every registered experiment imported,
    neither is."""
    import subprocess
    import sys

    probe = ("import sys; import pipeline.cli, pipeline.stages.prepare, pipeline.stages.train, pipeline.stages.evaluate; "
             "import pipeline.training.bench; "
             "from pipeline.core import registry; [registry.load(n) for n in registry.names()]; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'torchvision', 'pipeline'}))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=PACKAGE.parent, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['pipeline']"], out.stdout + out.stderr
