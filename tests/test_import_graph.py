"""Issue 11: no import cycle inside index/ (function-level imports included), and index/
imports nothing from app/ or loadtest/ (the lower layer never reaches up)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _graph() -> dict[str, set[str]]:
    """module -> the index modules it imports, from every import statement in its file."""
    modules = {}
    for path in (ROOT / "index").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        modules[name] = found
    return modules


def test_index_imports_no_upper_package():
    upward = {m: sorted(d for d in deps if d.split(".")[0] in ("app", "loadtest"))
              for m, deps in _graph().items()}
    assert {m: d for m, d in upward.items() if d} == {}


def test_no_import_cycle_in_index():
    modules = _graph()
    graph = {m: {d for d in deps if d in modules and d != m} for m, deps in modules.items()}
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
