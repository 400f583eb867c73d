"""The shape of the code. No import cycles among the project's own modules: the core
(`zoo`) and every built-in library, backend and plugin package. Edges are the imports a
module runs when it is imported (its top-level statements); imports inside functions are
deferred on purpose (a heavy library, or the SDK one command needs) and are not edges
here. No backend depends on another, nor the core on any of them. And no function of
the core over 80 lines."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def packages(pattern: str) -> list[Path]:
    """The packages a glob finds (an editable install leaves a `zoo_*.egg-info` beside each)."""
    return sorted(p for p in ROOT.glob(pattern) if (p / "__init__.py").is_file())


LIBS = packages("libs/*/zoo_*")
BACKENDS = packages("backends/*/zoo_*")
PACKAGES = [ROOT / "zoo", *LIBS, *BACKENDS, *packages("plugins/*/zoo_*")]


def module_name(path: Path, package_root: Path) -> str:
    parts = path.relative_to(package_root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_at_import_time(tree: ast.Module):
    """Import statements run when the module is imported: top level, and inside top-level
    if/try/with blocks (a conditional import still runs), not inside functions or classes."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(h for handler in getattr(node, "handlers", []) for h in handler.body)]


def graph() -> dict[str, set[str]]:
    files = {module_name(p, pkg): p for pkg in PACKAGES for p in pkg.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in imports_at_import_time(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                # `from pkg import sub` imports the submodule sub where one exists
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            found |= {t for t in targets if t in files and t != name}
        edges[name] = found
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_packages():
    edges = graph()
    assert {"zoo", "zoo.cli", "zoo.cli_bench", "zoo_onnx", "zoo_torch", "zoo_onnxruntime", "zoo_vision"} <= set(edges)
    assert "zoo.cli_common" in edges["zoo.cli_bench"] and "zoo.cli_bench" in edges["zoo.cli"]
    assert "zoo.registry" in edges["zoo"] and "zoo.export" not in edges["zoo"]  # imported on first use


def test_no_import_cycles():
    assert cycles(graph()) == []


LIGHT = """
import sys, types
import zoo, zoo.cli, zoo.bench, zoo.bench.report, zoo.client, zoo.serve.perf
heavy = sorted({"torch", "onnxruntime", "openvino", "transformers", "onnx"} & set(sys.modules))
assert not heavy, heavy
import zoo.export, zoo.train, zoo.verify, zoo.predict
assert [f.__name__ for f in (zoo.export, zoo.train, zoo.verify, zoo.predict)] == \\
    ["export", "train", "verify", "predict"]
assert isinstance(sys.modules["zoo.export"], types.ModuleType) and zoo.bench.benchmark is zoo.benchmark
"""


def test_import_zoo_imports_no_deep_learning_library():
    """`import zoo` (what every plugin does), the CLI's entry and `zoo bench --url`'s
    client import no deep-learning library: PyTorch is imported by the commands that use
    it. The package's functions named like its submodules (`zoo.export`) stay functions
    once those submodules are imported."""
    done = subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def first_party_imports(package: Path) -> set[str]:
    """The other first-party packages `package` imports anywhere, deferred imports included."""
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    return (found & {p.name for p in PACKAGES}) - {package.name}


def test_backends_share_libraries_not_one_another():
    """What two backends share lives in a library under libs/ (the ONNX export, engine
    provenance), so each backend installs and runs without the others: none imports or
    declares another, and the core imports none of them."""
    tomllib = pytest.importorskip("tomllib")
    libs, backends = {p.name for p in LIBS}, {p.name for p in BACKENDS}
    assert {"zoo_onnx"} <= libs and {"zoo_onnxruntime", "zoo_tensorrt", "zoo_openvino"} <= backends
    assert first_party_imports(ROOT / "zoo") == set()
    for package in LIBS:
        assert first_party_imports(package) == {"zoo"}, package.name
    for package in BACKENDS:
        assert first_party_imports(package) <= {"zoo", *libs}, package.name
    projects = {p: tomllib.loads((p.parent / "pyproject.toml").read_text())["project"] for p in LIBS + BACKENDS}
    names = {project["name"] for p, project in projects.items() if p in BACKENDS}
    for package, project in projects.items():
        requires = {re.split(r"[ \[<>=!~;]", r, maxsplit=1)[0] for r in project.get("dependencies", [])}
        assert not requires & names, f"{project['name']} depends on another backend: {requires & names}"
        assert package in BACKENDS or "entry-points" not in project, f"{project['name']} is a library, not a plugin"


def test_no_core_function_runs_over_80_lines():
    """The core stays readable one function at a time (its signature and docstring count)."""
    long = []
    for path in sorted((ROOT / "zoo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                            f"({node.end_lineno - node.lineno + 1} lines)")
    assert long == []
