"""The package's shape, read from its imports (AST, not text): no import cycles between
files or between packages, no module loaded by a computed name, and SQL only in the
manager (docs/architecture.md, "who may import whom").

Every import counts, also one inside a function: a cycle hidden in a function is still
a cycle between two files that cannot be understood apart. Only imports under
``if TYPE_CHECKING:`` are left out (they never run).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "jupyterhub_backendai"
NAME = PKG.name

# The front ends: what serves users and admins. They ask the manager by name and never
# touch the record themselves.
FRONT_ENDS = ("api", "pages", "spawner", "auth", "cli", "hubgate", "launcher", "hubmain",
              "singleusermain",
              "appfront")
RECORD = ("models", "sqlalchemy")


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if "migrations" in parts:
            continue  # alembic's scripts, run by alembic
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(module: str, path: pathlib.Path) -> list[tuple[str, int]]:
    """(module imported, line) for every import of ``module`` that names this package
    or a third-party package (absolute name)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    out = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here[: len(here) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module
                for a in child.names:
                    sub = f"{target}.{a.name}"
                    out.append((sub if sub in MODULES else target, child.lineno))
            visit(child)

    visit(tree)
    return sorted(set(out), key=lambda e: (e[1], e[0]))


GRAPH = {m: [(t, line) for t, line in _imports(m, p) if t in MODULES and t != m]
         for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _package_of(module: str) -> str:
    """The room a module belongs to: its first level below the package (manager,
    api, agent, ...), or the top-level module itself (spawner, auth, ...)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def test_the_graph_is_read():
    """The reader finds the package's imports (a broken reader would pass every test below)."""
    assert len(MODULES) > 80
    core = GRAPH[f"{NAME}.manager.core"]
    assert (f"{NAME}.manager.lifecycle", ) <= tuple(t for t, _ in core) or any(
        t.startswith(f"{NAME}.manager.lifecycle") for t, _ in core)
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_files():
    graph = {m: {t for t, _ in edges} for m, edges in GRAPH.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles between files:\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for m, edges in GRAPH.items():
        src = _package_of(m)
        for t, _ in edges:
            dst = _package_of(t)
            if dst != src and src != NAME and dst != NAME:
                graph.setdefault(src, set()).add(dst)
    cycles = _cycles(graph)
    why = []
    for c in cycles:
        for m, edges in GRAPH.items():
            for t, line in edges:
                if _package_of(m) in c and _package_of(t) in c and _package_of(m) != _package_of(t):
                    why.append(f"{m}:{line} -> {t}")
    assert not cycles, f"packages importing each other: {cycles}\n" + "\n".join(why)


def test_no_module_is_loaded_by_a_computed_name():
    """importlib/__import__ hide a dependency from every reader (and from this test)."""
    found = []
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] == "importlib" for n in names):
                    found.append(f"{m}:{node.lineno}")
            elif isinstance(node, ast.Name) and node.id == "__import__":
                found.append(f"{m}:{node.lineno}")
    assert not found, f"modules loaded by computed names: {found}"


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_front_ends_touch_no_record(front):
    """SQL only in the manager: a front end imports neither the ORM models nor
    SQLAlchemy; it calls the manager's named operations."""
    bad = []
    for m, path in MODULES.items():
        if _package_of(m) != f"{NAME}.{front}":
            continue
        for t, line in _imports(m, path):
            top = t.split(".")
            if t.startswith(f"{NAME}.models") or top[0] == "sqlalchemy":
                bad.append(f"{m}:{line} imports {t}")
    assert not bad, "\n".join(bad)


def test_the_manager_does_not_import_its_front_ends():
    bad = [f"{m}:{line} -> {t}" for m, edges in GRAPH.items()
           if _package_of(m) in (f"{NAME}.manager", f"{NAME}.models", f"{NAME}.common")
           for t, line in edges
           if _package_of(t) in {f"{NAME}.{f}" for f in FRONT_ENDS}]
    assert not bad, "\n".join(bad)


def test_the_status_table_and_the_handlers_agree():
    """docs/architecture.md's status table names each handler of the lifecycle, and only
    those; each declares the changes it may write (or that it changes no status), and
    a handler that writes a change it does not declare is stopped."""
    import asyncio
    import re

    from jupyterhub_backendai.manager.lifecycle import handlers

    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("| status | handler (`lifecycle/handlers.py`)"):]
    table = table[: table.index("\n\n")]
    named = set(re.findall(r"^\| [^|]+ \| `(\w+)` \|", table, re.M))
    assert named == {h.__name__ for h in handlers.HANDLERS}
    for h in handlers.HANDLERS:
        # A handler changes statuses and declares which, or declares that it changes none.
        if h.changes_status:
            assert h.writes, f"{h.__name__} declares no change it may write"
        else:
            assert not h.writes, f"{h.__name__} says it changes no status but declares {h.writes}"

    class Driver:  # what a handler needs before it touches the record: nothing
        mgr = None

    lost = handlers.LostAgent(Driver())
    with pytest.raises(handlers.LifecycleError, match="LostAgent does not declare"):
        asyncio.run(lost.transition("sid", {"RUNNING"}, "PENDING"))


def test_no_wait_for_that_can_swallow_a_cancel():
    """``asyncio.wait_for`` of Python 3.11 returns the inner result, and drops the
    cancellation, when the awaited thing finishes in the same loop turn as the cancel:
    JupyterHub's DELETE of a starting server then waited on a start() that went on,
    and answered 500 (seen in CI). ``asyncio.timeout`` keeps the cancel; it is the only
    timeout the package uses (test_sessions_watch_cancel performs the race)."""
    found = []
    for m, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "wait_for" \
                    and isinstance(node.value, ast.Name) and node.value.id == "asyncio":
                found.append(f"{m}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and node.module == "asyncio" \
                    and any(a.name == "wait_for" for a in node.names):
                found.append(f"{m}:{node.lineno}")
    assert not found, f"asyncio.wait_for used at {found}"
