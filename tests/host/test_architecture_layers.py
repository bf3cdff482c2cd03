"""compile/'s layering, read from the code's own imports (ast, every import: top-level, in a function, or only for
type checking). docs/architecture.md ("compile/: a house with wings") draws it:

- the ground: compile/stage.py (`BuildContext`, `@stage`, the registry), which imports no stage, and config.py (what
  a build is asked: the CUDA configuration, the tuning request), which imports nothing of compile/;
- the wings: cuda/, int8/, frontends/, tuning/; a wing imports from compile's top level only the ground, and the
  wings depend on each other in one direction (no two wings import each other, no circle through a third);
- the top: pipeline.py, package.py, tvm_backend.py, the CUDA worker and the commands, which use the wings;
- no import circle among compile's modules, and nothing in compile/ imports the CLI, the API or remote/.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

HOST = Path(__file__).resolve().parents[2] / "host"
COMPILE = "edgedeploy.compile"
WINGS = ("cuda", "int8", "frontends", "tuning")
STAGE = f"{COMPILE}.stage"
GROUND = (STAGE, f"{COMPILE}.config")
ABOVE_COMPILE = ("edgedeploy.cli", "edgedeploy.api", "edgedeploy.remote")


def module_name(path: Path) -> str:
    parts = path.relative_to(HOST).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> Iterator[str]:
    """The edgedeploy modules `path` imports (a name imported from a package counts as its module when it is one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("edgedeploy"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("edgedeploy."):
                continue
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
            yield from subs or [target]


FILES = {module_name(p): p for p in (HOST / "edgedeploy").rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    modules = set(FILES)
    return {m: {t for t in imports_of(p, modules) if t in modules and t != m} for m, p in FILES.items()}


def wing_of(module: str) -> str | None:
    parts = module.split(".")
    if module.startswith(COMPILE + ".") and len(parts) > 3 and parts[2] in WINGS:
        return parts[2]
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


GRAPH = import_graph()
COMPILE_GRAPH = {m: {t for t in ts if t.startswith(COMPILE)} for m, ts in GRAPH.items() if m.startswith(COMPILE)}


def test_the_wings_are_packages() -> None:
    assert all(f"{COMPILE}.{w}" in GRAPH for w in WINGS)
    assert {wing_of(m) for m in GRAPH} >= set(WINGS)


def test_no_import_circle_in_compile() -> None:
    assert cycles(COMPILE_GRAPH) == []


def test_a_wing_imports_only_the_ground_from_compiles_top() -> None:
    up = [
        f"{m} -> {t}"
        for m, ts in COMPILE_GRAPH.items()
        if wing_of(m)
        for t in ts
        if wing_of(t) is None and t not in (*GROUND, COMPILE)
    ]
    assert up == []


def test_the_wings_depend_on_each_other_one_way() -> None:
    wings: dict[str, set[str]] = {w: set() for w in WINGS}
    for m, ts in COMPILE_GRAPH.items():
        for t in ts:
            if wing_of(m) and wing_of(t) and wing_of(m) != wing_of(t):
                wings[wing_of(m)].add(wing_of(t))  # type: ignore[index]
    assert cycles(wings) == [], wings


def test_the_stage_registry_imports_no_stage() -> None:
    """Stage modules import stage.py to register; stage.py imports no module that registers a stage."""
    registering = {m for m in COMPILE_GRAPH if "@stage(" in FILES[m].read_text(encoding="utf-8")}
    assert {"edgedeploy.compile.tvm_backend", "edgedeploy.compile.int8.rewrite"} <= registering
    reach, todo = set(), [STAGE]
    while todo:
        for t in COMPILE_GRAPH[todo.pop()] - reach:
            reach.add(t)
            todo.append(t)
    assert reach & registering == set()
    assert COMPILE_GRAPH[f"{COMPILE}.config"] == set()


@pytest.mark.parametrize("above", ABOVE_COMPILE)
def test_compile_imports_nothing_above_it(above: str) -> None:
    back = [f"{m} -> {t}" for m, ts in GRAPH.items() if m.startswith(COMPILE) for t in ts if t.startswith(above)]
    assert back == []


def test_the_checker_sees_a_circle_and_an_arrow_back_up() -> None:
    """The rules above fail on the shapes they forbid (today's code has none to show)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert wing_of(f"{COMPILE}.cuda.tiles") == "cuda" and wing_of(f"{COMPILE}.pipeline") is None
    # before the wings, the registry (pipeline.py) imported the stage modules that imported it
    before = {"pipeline": {"tvm_backend", "nhwc"}, "tvm_backend": {"pipeline"}, "nhwc": {"pipeline"}}
    assert cycles(before) == [["nhwc", "pipeline", "tvm_backend"]]
