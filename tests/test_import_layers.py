"""The packages stand in layers: `contract` at the bottom imports none of the others, `serve`
never imports the judge, and no package imports another that imports it back, however
far round. Imports are read from the source with `ast`, at module level and inside
functions alike (a lazy import is a dependency too)."""
import ast
import sys
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("contract", "fitness", "target", "serve", "evolve", "mutations", "tools")
ENGINE_FILES = ("seed_engine/*.py", "mutations/alleles/*/*.py")  # the seed, each allele


def imported_modules(source: str) -> set:
    """Every absolute module a source imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def package_graph(repo: Path = REPO, packages=PACKAGES) -> dict:
    """{package: {package it imports: [files that do]}} over the packages' own files."""
    graph = {package: {} for package in packages}
    for package in packages:
        for path in sorted((repo / package).rglob("*.py")):
            for module in imported_modules(path.read_text()):
                top = module.split(".")[0]
                if top in packages and top != package:
                    graph[package].setdefault(top, set()).add(str(path.relative_to(repo)))
    return {package: {top: sorted(files) for top, files in imports.items()} for package, imports in graph.items()}


def find_cycle(graph: dict) -> list:
    """One cycle of the graph as [a, b, ..., a], or [] when it has none (depth-first)."""
    state = {}  # package -> "open" while on the path, "done" once all it reaches is seen

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt, path + [nxt])
                if cycle:
                    return cycle
        state[node] = "done"
        return []

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [start])
            if cycle:
                return cycle
    return []


def test_find_cycle_finds_a_cycle_however_far_round():
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": []}, "b": {"a": []}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b": [], "c": []}, "b": {"c": []}, "c": {}}) == []


def test_package_graph_reads_imports_inside_functions(tmp_path):
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    (tmp_path / "low" / "a.py").write_text("def late():\n    from high.b import thing\n    return thing\n")
    (tmp_path / "high" / "b.py").write_text("import low.a\nthing = 1\n")
    graph = package_graph(tmp_path, ("low", "high"))
    assert graph == {"low": {"high": ["low/a.py"]}, "high": {"low": ["high/b.py"]}}
    assert find_cycle(graph) == ["high", "low", "high"]


def test_no_package_imports_one_that_imports_it_back():
    graph = package_graph()
    cycle = find_cycle(graph)
    assert not cycle, " -> ".join(cycle) + ": " + "; ".join(
        f"{a} -> {b} in {', '.join(graph[a][b])}" for a, b in zip(cycle, cycle[1:]))


def test_the_contract_imports_none_of_the_other_packages():
    assert package_graph()["contract"] == {}


def test_serve_does_not_import_the_judge():
    assert "fitness" not in package_graph()["serve"]


def test_every_package_but_the_contract_stands_on_it():
    graph = package_graph()
    assert [p for p in PACKAGES if p != "contract" and "contract" not in graph[p]] == []


def test_engine_files_import_nothing_from_the_repository():
    """The seed and every allele stand alone: stdlib, torch, triton and safetensors only
    (the gate's static stage holds candidates to the same)."""
    allowed = {"torch", "triton", "safetensors"}
    for pattern in ENGINE_FILES:
        for path in REPO.glob(pattern):
            ours = {m for m in imported_modules(path.read_text()) if m.split(".")[0] in PACKAGES}
            assert not ours, f"{path.relative_to(REPO)} imports {sorted(ours)}"
            others = {m for m in imported_modules(path.read_text())
                      if m.split(".")[0] not in allowed | sys.stdlib_module_names}
            assert not others, f"{path.relative_to(REPO)} imports {sorted(others)}"


def test_no_package_imports_the_tests():
    """What tests and tools both read (the cheats, the planted faults) lives in a package
    (fitness.adversaries); the tests import the packages, never the other way round."""
    importers = [str(path.relative_to(REPO)) for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))
                 if any(module.split(".")[0] == "tests" for module in imported_modules(path.read_text()))]
    assert importers == []
