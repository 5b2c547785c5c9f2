"""The package's layering, read from its source with ``ast`` (nothing is imported): no import
cycle anywhere, the pure core below the drivers, the test cluster a layer of its own.

Every import counts, including those inside functions and under ``TYPE_CHECKING``: a cycle
hidden in a function body is still a cycle. ``from pkg import submodule`` is an edge to the
submodule (every module also imports its parent packages; those implicit edges are left out,
or ``clickhouse_lb/__init__.py``, which re-exports the pool, would close a loop with everything).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "clickhouse_lb"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def imports_of(module: str) -> set[str]:
    """The package's modules that ``module`` imports."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, path.name == "__init__.py", node.level, node.module)
            names = []
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                names.append(submodule if submodule in MODULES else source)
        else:
            continue
        for imported in names:
            # The longest prefix that is one of the package's modules (`import a.b.c` names a.b.c).
            name = imported
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name.startswith(PACKAGE) and name != module:
                found.add(name)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def _cycle() -> list[str] | None:
    """One import cycle, as the list of modules around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(GRAPH):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_the_graph_is_read() -> None:
    # Guards the reader itself: a parser that found nothing would pass every test below.
    assert "clickhouse_lb.core.failover" in GRAPH["clickhouse_lb.pools.pool"]
    assert "clickhouse_lb.testing._encoding" in GRAPH["clickhouse_lb.testing.server"]
    assert "clickhouse_lb.cli._demo" in GRAPH["clickhouse_lb.cli._main"]  # imported inside a function


def test_no_import_cycle() -> None:
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_finder_sees_a_cycle() -> None:
    GRAPH["clickhouse_lb.config.settings"].add("clickhouse_lb.core.balancer")
    try:
        assert _cycle() is not None
    finally:
        GRAPH["clickhouse_lb.config.settings"].discard("clickhouse_lb.core.balancer")


def _reachable(module: str) -> set[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        for target in GRAPH[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


TESTING = "clickhouse_lb.testing"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m == TESTING or m.startswith(TESTING + ".")))
def test_the_test_cluster_imports_nothing_from_the_pool(module: str) -> None:
    outside = {m for m in GRAPH[module] if m != TESTING and not m.startswith(TESTING + ".")}
    assert outside == set(), f"{module} imports {sorted(outside)}"


#: The package's layers, lowest first. A module belongs to the first layer whose prefix names it;
#: a layer may import its own layer and the layers below it, never one above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("leaves", ("clickhouse_lb._version", "clickhouse_lb._redact", "clickhouse_lb._part_outcome",
                "clickhouse_lb.errors")),
    ("config", ("clickhouse_lb.config",)),
    ("core", ("clickhouse_lb.core",)),
    ("probes", ("clickhouse_lb.probes",)),
    ("pools", ("clickhouse_lb.pools",)),
    ("integrations", ("clickhouse_lb.sqlalchemy", "clickhouse_lb.prometheus", "clickhouse_lb.alembic")),
    ("cli", ("clickhouse_lb.cli",)),
    ("entry points", ("clickhouse_lb.__main__", "clickhouse_lb")),
]
#: The test cluster is beside the layers, not in them (its own test above): nothing in it imports
#: the library, and of the library only the demo (cli) starts one.
OUTSIDE_LAYERS = {TESTING: {"cli"}}


def _in(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(_in(module, prefix) for prefix in prefixes):
            return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


LAYERED = sorted(m for m in MODULES if not _in(m, TESTING))


@pytest.mark.parametrize("module", LAYERED)
def test_every_import_goes_down_or_sideways(module: str) -> None:
    rank = layer_of(module)
    up = set()
    for target in GRAPH[module]:
        if _in(target, TESTING):
            if LAYERS[rank][0] not in OUTSIDE_LAYERS[TESTING]:
                up.add(target)
        elif layer_of(target) > rank:
            up.add(target)
    assert up == set(), f"{module} ({LAYERS[rank][0]}) imports from a layer above: {sorted(up)}"


def test_the_layer_check_sees_an_upward_import() -> None:
    GRAPH["clickhouse_lb.core.ordering"].add("clickhouse_lb.pools.pool")
    try:
        with pytest.raises(AssertionError, match="layer above"):
            test_every_import_goes_down_or_sideways("clickhouse_lb.core.ordering")
    finally:
        GRAPH["clickhouse_lb.core.ordering"].discard("clickhouse_lb.pools.pool")


#: Size limits: a small top level, no module over 400 lines outside the test cluster.
MAX_TOP_LEVEL_MODULES = 12
MAX_MODULE_LINES = 400


def test_the_top_level_is_small() -> None:
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def _too_long(root: Path) -> dict[str, int]:
    """The modules over the limit below ``root``, outside ``testing/``, with their line counts."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] == "testing":
            continue
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            found[relative.as_posix()] = lines
    return found


def test_no_module_is_over_the_size_limit() -> None:
    assert _too_long(ROOT) == {}, f"modules over {MAX_MODULE_LINES} lines: split them by job"


def test_the_size_check_sees_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "testing").mkdir()
    (tmp_path / "testing" / "cluster.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))  # allowed there
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert _too_long(tmp_path) == {"long.py": MAX_MODULE_LINES + 1}


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("clickhouse_lb.pools.aio", "clickhouse_lb.pools.pool"),  # the async pool does not load the sync one
        ("clickhouse_lb.pools.pool", "clickhouse_lb.pools.aio"),  # nor the sync one aiohttp
        ("clickhouse_lb.cli._demo", "clickhouse_lb.cli._main"),  # the demo shares _console with the CLI
        ("clickhouse_lb.core._statements", "clickhouse_lb.core.failover"),
        ("clickhouse_lb.sqlalchemy.dialect", "clickhouse_lb.sqlalchemy.aio"),
    ],
)
def test_twins_and_neighbours_stay_apart(module: str, forbidden: str) -> None:
    assert forbidden not in _reachable(module)


def test_importing_the_test_cluster_loads_nothing_of_the_pool() -> None:
    # At run time too: importing clickhouse_lb.testing runs clickhouse_lb/__init__.py, which loads
    # its public names lazily; a replica process must not pay for the pool and clickhouse-connect.
    code = (
        "import sys, clickhouse_lb.testing, clickhouse_lb.testing.replica\n"
        "print(sorted(m for m in sys.modules if m.startswith('clickhouse_lb') "
        "and not m.startswith('clickhouse_lb.testing')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['clickhouse_lb', 'clickhouse_lb._version']"


def test_every_public_name_resolves() -> None:
    import clickhouse_lb

    for name in clickhouse_lb.__all__:
        assert getattr(clickhouse_lb, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = clickhouse_lb.no_such_name  # type: ignore[attr-defined]
