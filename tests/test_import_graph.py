"""Issue 11: no import cycle inside index/ (function-level imports included), and index/
imports nothing from app/ or loadtest/ (the lower layer never reaches up).

Issue 29 item 4: the folders show the floors (docs/architecture.md opens with the map): no
circle between the folders of index/ and no arrow from a folder to one on a higher floor; no
import cycle among the files of index/ and app/ together; no app/ file reads a private name
(``_name``) of index/."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _graph(*packages: str) -> dict[str, set[str]]:
    """module -> the names it imports, from every import statement in its file (``packages``:
    the folders read, index/ by default)."""
    modules = {}
    for path in [p for package in packages or ("index",) for p in (ROOT / package).rglob("*.py")]:
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
    assert "bucketsearch.index.disk.fsio" in graph["bucketsearch.index.storage.wal"]


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


# ------------------------------------------------------------------------------ folders (issue 29)
#: the floors of index/, lowest first: a folder imports only from folders on lower floors
#: (docs/architecture.md section 0). The root holds the engines and what they are built of.
FLOORS = {
    "bucketsearch.index.disk": 0,  # the fault-injectable I/O layer and the snapshot arrays
    "bucketsearch.index.fits": 0,  # the cost model's fitting formulas (the planner's too)
    "bucketsearch.index": 1,  # codes, kernels, tables, the engines, their factory, the join
    "bucketsearch.index.costmodel": 2,  # estimators and fits of the engines' cost
    "bucketsearch.index.metrics": 2,  # the metric formulas
    "bucketsearch.index.storage": 2,  # the live index: state, log, snapshots, recovery
    "bucketsearch.index.evaluation": 3,  # everything built on the formulas (the eval command)
    "bucketsearch.index.cluster": 3,  # a sharded index on Ray: ingress, shard actors, jobs
}
#: arrows that run up, each with its reason (none: the planner's fits moved to fits/)
KNOWN_UPWARD: set[tuple[str, str]] = set()


def folder_of(module: str) -> str:
    """The package a module belongs to (a package's ``__init__`` is its own package)."""
    path = ROOT.joinpath(*module.split(".")[1:])
    return module if path.is_dir() else module.rsplit(".", 1)[0]


def _folder_edges() -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(folder, folder) -> the module edges behind it, between distinct folders of index/."""
    modules = _graph()
    edges: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for module, deps in modules.items():
        for dep in deps:
            if dep in modules and folder_of(dep) != folder_of(module):
                edges.setdefault((folder_of(module), folder_of(dep)), set()).add((module, dep))
    return edges


def test_every_folder_of_index_has_a_floor():
    folders = {folder_of(m) for m in _graph()}
    assert folders == set(FLOORS)


def test_no_folder_imports_a_higher_floor():
    """Every arrow between folders goes down (the known ones, named above, excepted)."""
    edges = _folder_edges()
    assert ("bucketsearch.index.storage", "bucketsearch.index") in edges  # real edges seen
    upward = {edge for (a, b), found in edges.items() if FLOORS[b] >= FLOORS[a]
              for edge in found}
    assert upward == KNOWN_UPWARD


def test_no_circle_between_folders_of_index():
    """Past the known upward arrows, the folders form no circle."""
    graph: dict[str, set[str]] = {}
    for (a, b), found in _folder_edges().items():
        if found - KNOWN_UPWARD:
            graph.setdefault(a, set()).add(b)
    cycle = find_cycle(graph)
    assert cycle is None, "folder circle: " + " -> ".join(cycle)


def test_no_import_cycle_in_index_and_app():
    """Files of index/ and app/ together, function-level imports included."""
    modules = _graph("index", "app")
    assert "bucketsearch.index.storage.live" in modules["bucketsearch.app.registry"]
    graph = {m: {d for d in deps if d in modules and d != m} for m, deps in modules.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _private_names_of_index() -> set[str]:
    """Every ``_name`` index/ defines: functions, classes, module names, attributes."""
    found = set()
    for path in (ROOT / "index").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                found.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
    return {n for n in found if n.startswith("_") and not n.startswith("__")}


def private_reads(source: str, private: set[str]) -> list[str]:
    """What ``source`` (an app/ file) reads of ``private``: ``from bucketsearch.index... import
    _x`` and ``<anything but self/cls>._x``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bucketsearch.index"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute) and node.attr in private and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(ast.unparse(node))
    return found


#: private reads that remain, each with its reason; the test fails when one disappears too
KNOWN_PRIVATE_READS: dict[str, list[str]] = {}


def test_no_app_file_reads_a_private_name_of_index():
    private = _private_names_of_index()
    assert {"_set_items", "_check_writable"} <= private  # the check sees index's names
    assert private_reads("from bucketsearch.index.codes import _x\nlive.state._check_writable\n"
                         "self._check_writable\n", private) == \
        ["bucketsearch.index.codes._x", "live.state._check_writable"]
    found = {str(p.relative_to(ROOT)): reads for p in sorted((ROOT / "app").rglob("*.py"))
             if (reads := private_reads(p.read_text(), private))}
    assert found == KNOWN_PRIVATE_READS


# ------------------------------------------------------------- the index handle (issue 29)
#: what an index holds inside: read through the handle's methods only
#: (bucketsearch.index.handle), never by the service
INDEX_INSIDES = {"main", "delta", "delta_ids", "delta_words", "tombstones", "main_ids",
                 "main_ids_sorted"}
#: names whose ``getattr``/``hasattr`` probes an index's engine kind or insides
ENGINE_PROBES = INDEX_INSIDES | {"state", "sharded", "single", "mih", "table", "kind"}
#: app-owned objects whose ``.state`` is theirs, not an index's: FastAPI's ``app.state`` and
#: ``request.state`` (also as ``<x>.app.state`` and ``scope["app"].state``), and a job's
#: lifecycle (app/jobs.py ``Job.state``: running, completed, ...)
APP_STATE_OWNERS = {"app", "request", "job", "j"}


def _owns_state(receiver: ast.expr) -> bool:
    """Whether ``receiver.state`` is an app-owned object's state (see APP_STATE_OWNERS)."""
    if isinstance(receiver, ast.Name):
        return receiver.id in APP_STATE_OWNERS
    if isinstance(receiver, ast.Attribute):
        return receiver.attr == "app"
    if isinstance(receiver, ast.Subscript):  # scope["app"]
        return isinstance(receiver.slice, ast.Constant) and receiver.slice.value == "app"
    return False


def index_insides_read(source: str) -> list[str]:
    """What ``source`` (an app/ file) reads of an index's insides: ``x.main``, ``x.delta*``,
    ``x.tombstones`` of anything, ``x.state`` of anything not app-owned, and
    ``getattr``/``hasattr`` probes of those or of engine kinds (``sharded``, ``single``,
    ``table``, ``kind``...)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and (
                node.attr in INDEX_INSIDES
                or node.attr == "state" and not _owns_state(node.value)):
            found.append(ast.unparse(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in ENGINE_PROBES:
            found.append(ast.unparse(node))
    return found


def test_index_insides_read_sees_what_it_should():
    src = ("live.state.main\nentry.live.state\nst.delta_ids\nlen(state.tombstones)\n"
           "getattr(entry.live, 'sharded', False)\ngetattr(main, 'kind', '')\n"
           "request.app.state.settings\napp.state.ready\nscope['app'].state\njob.state\n"
           "entry.live.view().sizes().tombstoned\ngetattr(state, 'ready', False)\n")
    assert sorted(index_insides_read(src)) == sorted([
        "live.state.main", "live.state", "entry.live.state", "st.delta_ids", "state.tombstones",
        "getattr(entry.live, 'sharded', False)", "getattr(main, 'kind', '')"])


def test_no_app_file_reads_an_index_s_insides():
    """Issue 29 acceptance: the service asks an index through the handle protocol
    (bucketsearch.index.handle) only: no app/ file reads ``.state``, ``.main``, ``.delta*`` or
    ``.tombstones`` of an index, nor probes its engine kind with getattr."""
    found = {str(p.relative_to(ROOT)): reads for p in sorted((ROOT / "app").rglob("*.py"))
             if (reads := index_insides_read(p.read_text()))}
    assert found == {}
