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
        name = "bucketsearch." + ".".join(path.relative_to(ROOT).with_suffix("").parts) \
            .removesuffix(".__init__")
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        modules[name] = found
    return modules


UPPER = ("bucketsearch.app", "bucketsearch.loadtest", "bucketsearch.cli", "app", "loadtest")


def test_the_graph_is_read():
    """The checks below see real edges (module names carry the installed prefix)."""
    graph = _graph()
    assert "bucketsearch.index.storage.wal" in graph["bucketsearch.index.storage.live"]
    assert "bucketsearch.index.storage.fsio" in graph["bucketsearch.index.storage.wal"]


def test_index_imports_no_upper_package():
    upward = {m: sorted(d for d in deps if d.split(".")[0] in UPPER
                        or d.startswith(tuple(u + "." for u in UPPER)) or d in UPPER)
              for m, deps in _graph().items()}
    assert {m: d for m, d in upward.items() if d} == {}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> imported modules), or None (depth-first)."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path + [nxt]
            if nxt not in state:
                cycle = visit(nxt, path + [nxt])
                if cycle:
                    return cycle
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [module])
            if cycle:
                return cycle
    return None


def test_no_import_cycle_in_index():
    modules = _graph()
    graph = {m: {d for d in deps if d in modules and d != m} for m, deps in modules.items()}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_router_imports_another_router():
    """Issue 11 item 4: routers stay thin; what two routers share lives in app/parsing.py (or
    a service module), never in a router that another router imports."""
    routers = {p.stem for p in (ROOT / "app" / "routers").glob("*.py") if p.stem != "__init__"}
    prefixes = ("bucketsearch.app.routers", "app.routers")
    found = {}
    for path in sorted((ROOT / "app" / "routers").glob("*.py")):
        bad = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:  # relative: "from . import x" or "from .x import y"
                    bad.append("." * node.level + (node.module or "")
                               + ("" if node.module else " import "
                                  + ", ".join(a.name for a in node.names)))
                    continue
                mod = node.module or ""
                if mod in prefixes:  # from bucketsearch.app.routers import search
                    bad += [f"{mod}.{a.name}" for a in node.names if a.name in routers]
                elif mod.startswith(tuple(p + "." for p in prefixes)):
                    bad.append(mod)
            elif isinstance(node, ast.Import):
                bad += [a.name for a in node.names
                        if a.name.startswith(tuple(p + "." for p in prefixes))]
        if bad:
            found[path.name] = bad
    assert routers, "no router modules found"
    assert found == {}
