"""The package's import graph has no cycle: experiment report modules build on the shared ones,
never the reverse (imports inside functions count too: they hide a cycle, they do not remove it)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"


def imports_of(path: Path) -> set[str]:
    """The pipeline modules a file imports anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipeline"):
            if node.module == "pipeline":
                names |= {a.name for a in node.names}
            else:
                names.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[1] for a in node.names if a.name.startswith("pipeline.")}
    return names & {p.stem for p in PACKAGE.glob("*.py")}


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


def test_no_import_cycle_in_the_package():
    graph = {p.stem: imports_of(p) - {p.stem} for p in PACKAGE.glob("*.py")}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    assert find_cycle({"report": {"report_multimnist"}, "report_multimnist": {"report"}}) == [
        "report", "report_multimnist", "report"]  # the cycle this test exists for is found


def test_shared_report_modules_know_no_experiment():
    for shared in ("runs", "stats", "report"):
        assert not imports_of(PACKAGE / f"{shared}.py") & {"report_affnist", "report_multimnist", "report_stage"}, shared
