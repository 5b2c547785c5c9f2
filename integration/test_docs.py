"""Every Python example of README.md and of every page of the documentation site, run against a
real cluster.

The pages are every ``.md`` file that ``mkdocs build`` renders: all of them under mkdocs.yml's
``docs_dir`` (mkdocs builds every Markdown file there, in the nav or not). Each fenced ``python``
block is one test, named by file and line (``README.md:61``), run as a reader would paste it,
after one documented substitution that maps the hosts a reader writes to the cluster: one
local cluster for the module whose replicas share one port on 127.0.0.11-13
(``LocalCluster(shared_port=True)``), or docker-compose.yml's with ``CLICKHOUSE_LB_CLUSTER=docker``:

* ``ch-N:8123`` becomes the address of replica N;
* ``ch-1,ch-2,ch-3:8123`` (one port shared by several hosts) becomes the replicas' addresses
  with their shared port when the cluster has one; otherwise the same hosts written the way a
  per-host-port cluster needs them (``?host=a:p&host=b:q`` in a SQLAlchemy URL, ``a:p,b:q`` in a
  DSN);
* ``user:pw@`` becomes ``default:@`` (the test clusters' only user); database ``analytics`` is
  created on every replica before the first block runs;
* ``CLICKHOUSE_LB_DSN`` (the variable the README's quick start reads, where a reader puts the DSN
  ``clickhouse-lb cluster`` printed) holds that cluster's DSN, in the form that command prints:
  ``clickhouse://user:password@host:port,host:port,.../analytics``.

A block that defines ``test_*`` functions is a pytest example: it runs as a pytest file in a
subprocess, with the ``clickhouse_lb.testing.pytest_plugin`` fixtures.

Examples are written as a real cluster needs them (tables created ``ON CLUSTER lb_cluster`` as
``ReplicatedMergeTree``): the local cluster replicates, and docker-compose.yml is a real one.

A block that cannot run here says so twice: a visible sentence for readers ("Not run by the
docs test: ..."), and ``<!-- docs-test: skip (reason) -->`` on the line right before the block.
``test_blocks_not_run_are_listed`` lists those, with their reasons (also shown in the terminal
summary by integration/conftest.py).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from clickhouse_lb.testing import ENV_VAR, ClusterBase, LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
DOCS_DIR = ROOT / MKDOCS.get("docs_dir", "docs")
#: README.md and every page mkdocs builds (every Markdown file under docs_dir).
DOC_FILES = [ROOT / "README.md", *sorted(DOCS_DIR.rglob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<kind>skip)\s*(?:\((?P<reason>.*)\))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced Python block of a Markdown file."""

    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    marker: str | None = None  # "skip"
    reason: str = ""

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def is_pytest_example(self) -> bool:
        return re.search(r"^(?:async )?def test_\w+\(", self.code, re.MULTILINE) is not None


def python_blocks(path: Path) -> list[Block]:
    """The ``python`` fenced blocks of a Markdown file, with the marker on the line before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise AssertionError(f"{path.name}:{i + 1}: unclosed code fence")
        if fence["lang"] in ("python", "py"):
            code = textwrap.dedent("\n".join(lines[i + 1 : end]))
            previous = lines[i - 1] if i > 0 else ""
            marker = _MARKER.match(previous)
            blocks.append(
                Block(
                    path,
                    i + 1,
                    code,
                    marker["kind"] if marker else None,
                    (marker["reason"] or "") if marker else "",
                )
            )
        i = end + 1
    return blocks


ALL_BLOCKS = [block for path in DOC_FILES for block in python_blocks(path)]


# -- the substitution ---------------------------------------------------------------------------
_SHARED_PORT_HOSTS = re.compile(r"ch-\d+(?:,ch-\d+)+:8123")
_SQLALCHEMY_URL = re.compile(
    r"(?P<scheme>clickhousedb\+lb(?:_async)?://)(?P<user>[^@/\"']*@)?(?P<hosts>ch-\d+(?:,ch-\d+)+):8123"
    r"/(?P<db>[^?\"']*)(?:\?(?P<query>[^\"']*))?"
)
_ONE_HOST = re.compile(r"ch-(\d+):8123")


def _replica(hosts: list[str], number: str) -> str:
    n = int(number)
    if not 1 <= n <= len(hosts):
        raise AssertionError(f"the example names ch-{n}, the cluster has {len(hosts)} replicas")
    return hosts[n - 1]


def localize(code: str, hosts: list[str]) -> str:
    """The substitution described in the module docstring (pure; tested below)."""
    code = code.replace("user:pw@", "default:@")
    ports = {h.rpartition(":")[2] for h in hosts}
    if len(ports) == 1:  # one shared port: keep every URL form as written
        port = ports.pop()

        def shared(m: re.Match[str]) -> str:
            names = m.group(0).rpartition(":")[0].split(",")
            return ",".join(_replica(hosts, n.removeprefix("ch-")).rpartition(":")[0] for n in names) + f":{port}"

        code = _SHARED_PORT_HOSTS.sub(shared, code)
    else:

        def per_host_url(m: re.Match[str]) -> str:
            params = [f"host={_replica(hosts, n.removeprefix('ch-'))}" for n in m["hosts"].split(",")]
            if m["query"]:
                params.append(m["query"])
            return f"{m['scheme']}{m['user'] or ''}/{m['db']}?{'&'.join(params)}"

        code = _SQLALCHEMY_URL.sub(per_host_url, code)
        code = _SHARED_PORT_HOSTS.sub(
            lambda m: ",".join(_replica(hosts, n.removeprefix("ch-")) for n in m.group(0)[:-5].split(",")), code
        )
    return _ONE_HOST.sub(lambda m: _replica(hosts, m[1]), code)


def test_localize_maps_reader_hosts_to_the_cluster() -> None:
    hosts = ["127.0.0.11:4001", "127.0.0.12:4002", "127.0.0.13:4003"]
    assert localize('get_pool(["ch-1:8123", "ch-3:8123"])', hosts) == 'get_pool(["127.0.0.11:4001", "127.0.0.13:4003"])'
    assert localize('"clickhousedb+lb://user:pw@ch-1,ch-2,ch-3:8123/analytics?load_balancing=in_order"', hosts) == (
        '"clickhousedb+lb://default:@/analytics?host=127.0.0.11:4001&host=127.0.0.12:4002'
        '&host=127.0.0.13:4003&load_balancing=in_order"'
    )
    assert localize('"clickhouse://ch-1,ch-2:8123/db"', hosts) == '"clickhouse://127.0.0.11:4001,127.0.0.12:4002/db"'
    shared = ["127.0.0.11:4000", "127.0.0.12:4000", "127.0.0.13:4000"]
    assert localize('"clickhousedb+lb://user:pw@ch-1,ch-2,ch-3:8123/db"', shared) == (
        '"clickhousedb+lb://default:@127.0.0.11,127.0.0.12,127.0.0.13:4000/db"'
    )
    with pytest.raises(AssertionError, match="ch-4"):
        localize('"ch-4:8123"', hosts)


def test_markers_are_read_from_the_line_before_a_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n<!-- docs-test: skip (needs Django) -->\n```python\nimport django\n```\n\n"
        "```bash\nls\n```\n\n<!-- docs-test: skip -->\n```python\nx = 1\n```\n"
        "```py\n    y = 2\n```\n",
        encoding="utf-8",
    )
    blocks = python_blocks(page)
    assert [(b.line, b.marker, b.reason, b.code) for b in blocks] == [
        (4, "skip", "needs Django", "import django"),
        (13, "skip", "", "x = 1"),
        (16, None, "", "y = 2"),
    ]


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def test_the_site_nav_lists_every_page_and_every_page_exists() -> None:
    """Every page of the site is in mkdocs.yml's nav (so none is built but unreachable) and every
    nav entry is a file under docs_dir; DOC_FILES, whose blocks run below, is exactly those pages
    and the README."""
    nav = [page for page in _nav_pages(MKDOCS["nav"]) if not page.startswith(("http://", "https://"))]
    pages = {path.relative_to(DOCS_DIR).as_posix() for path in DOCS_DIR.rglob("*.md")}
    assert sorted(nav) == sorted(pages)
    assert set(DOC_FILES) == {ROOT / "README.md", *(DOCS_DIR / page for page in nav)}


# -- running the blocks -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def docs_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterBase]:
    """docker-compose.yml's cluster with ``CLICKHOUSE_LB_CLUSTER=docker``; otherwise a local
    cluster of its own whose replicas share one port (127.0.0.11-13, one port), so that the
    shared-port URL forms run as written."""
    if os.environ.get(ENV_VAR, "local").strip().lower() == "docker":
        cluster: ClusterBase = request.getfixturevalue("clickhouse_cluster")
        cluster.heal()
        cluster.on_all("CREATE DATABASE IF NOT EXISTS analytics")
        yield cluster
        return
    with LocalCluster(replicas=3, shared_port=sys.platform.startswith("linux")) as local:
        local.on_all("CREATE DATABASE IF NOT EXISTS analytics")
        yield local


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Examples may configure logging (basicConfig, levels): undo it after each block."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in ("clickhouse_lb", "clickhouse_connect")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, saved in levels.items():
        logging.getLogger(name).setLevel(saved)


RUNNABLE = [b for b in ALL_BLOCKS if b.marker != "skip"]


def cluster_dsn(hosts: list[str], database: str = "analytics") -> str:
    """The DSN of the docs cluster in the form ``clickhouse-lb cluster`` prints (its only user,
    ``default``, has no password)."""
    return f"clickhouse://default:@{','.join(hosts)}/{database}"


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_example_runs(
    block: Block, docs_cluster: ClusterBase, tmp_path: Path, restore_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs_cluster.heal()
    monkeypatch.setenv("CLICKHOUSE_LB_DSN", cluster_dsn(docs_cluster.hosts))
    code = localize(block.code, docs_cluster.hosts)
    if block.is_pytest_example:
        run_as_pytest_file(block, code, tmp_path)
        return
    # Pad with blank lines so that a traceback's line numbers are the Markdown file's.
    compiled = compile("\n" * block.line + code, str(block.path), "exec")
    exec(compiled, {"__name__": "__docs_example__"})


def run_as_pytest_file(block: Block, code: str, tmp_path: Path) -> None:
    test_file = tmp_path / f"test_{block.path.stem.lower()}_{block.line}.py"
    test_file.write_text(code, encoding="utf-8")
    # The plugin as the README says to enable it, unless the example enables it itself.
    plugin = [] if "pytest_plugins" in code else ["-p", "clickhouse_lb.testing.pytest_plugin"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, str(test_file)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, f"{block.name} failed as a pytest file:\n{done.stdout}\n{done.stderr}"
    assert re.search(r"\b[1-9]\d* passed\b", done.stdout), done.stdout


def test_blocks_not_run_are_listed(record_property: pytest.RecordProperty) -> None:
    """Every block not run here has a reason in its marker and a visible sentence before it."""
    not_run = [b for b in ALL_BLOCKS if b.marker == "skip"]
    for block in not_run:
        assert block.reason, f"{block.name}: a skip marker needs a reason: <!-- docs-test: skip (why) -->"
        before = block.path.read_text(encoding="utf-8").splitlines()[max(0, block.line - 8) : block.line - 2]
        assert any("not run by the docs test" in line.lower() for line in before), (
            f"{block.name}: a skipped block needs a visible sentence before it: 'Not run by the docs test: why.'"
        )
    DOCS_NOT_RUN[:] = [f"{b.name}: {b.reason}" for b in not_run]
    record_property("docs_blocks_not_run", DOCS_NOT_RUN)
    assert len(RUNNABLE) > len(not_run)


#: Filled by test_blocks_not_run_are_listed; printed in the terminal summary (integration/conftest.py).
DOCS_NOT_RUN: list[str] = []
