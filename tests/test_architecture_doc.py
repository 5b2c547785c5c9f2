"""docs/architecture.md stays true: every module it names exists, and every module of the
package is named in it.

A module is named as a path in backquotes: relative to the package (`core/ordering.py`,
`errors.py`), or to the repository when it starts with one of its folders
(`tests/test_layers.py`, `bench/...`). The "Old module → new module" table is the exception: its
left column names modules as they were before the layout commit (they must NOT exist any more),
its right column as they are now (they must).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "clickhouse_lb"
DOC = REPO / "docs" / "architecture.md"
#: Paths in the doc that start with one of these are the repository's, not the package's.
REPO_FOLDERS = ("tests/", "bench/", "integration/", "docs/", "tools/", "clickhouse_lb/")
OLD_TO_NEW = "## Old module → new module"

_PATH = re.compile(r"`((?:[A-Za-z0-9_]+/)*[A-Za-z0-9_]+\.py)`")


def _sections(text: str) -> tuple[str, str]:
    """(the page without the old → new table's section, that section)."""
    start = text.index(OLD_TO_NEW)
    end = text.find("\n## ", start + 1)
    end = len(text) if end < 0 else end
    return text[:start] + text[end:], text[start:end]


TEXT = DOC.read_text(encoding="utf-8")
BODY, RENAMES = _sections(TEXT)


def _file(name: str) -> Path:
    return REPO / name if name.startswith(REPO_FOLDERS) else PACKAGE / name


def package_modules() -> list[str]:
    """Every module of the package, as the doc names it (relative to the package)."""
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def named(text: str) -> set[str]:
    return set(_PATH.findall(text))


def rename_rows() -> list[tuple[set[str], set[str]]]:
    rows = []
    for line in RENAMES.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and not set(cells[0]) <= set("-: "):
            rows.append((named(cells[0]), named(cells[1])))
    return rows[1:]  # the header row


def test_the_doc_names_modules_at_all() -> None:
    # Guards the reader: a pattern that found nothing would pass every test below.
    assert {"core/ordering.py", "pools/pool.py", "errors.py"} <= named(BODY)
    assert len(rename_rows()) >= 40


@pytest.mark.parametrize("name", sorted(named(BODY)))
def test_every_module_the_doc_names_exists(name: str) -> None:
    assert _file(name).is_file(), (
        f"docs/architecture.md names `{name}`, which does not exist ({_file(name).relative_to(REPO)}): "
        "fix the name, or remove the row if the module is gone"
    )


@pytest.mark.parametrize("module", package_modules())
def test_every_package_module_is_in_the_doc(module: str) -> None:
    folder = module.rpartition("/")[0] or "the top level"
    assert module in named(BODY), (
        f"clickhouse_lb/{module} is not named in docs/architecture.md: add a row "
        f"| `{module}` | what it holds | to the table of {folder} under 'Modules by layer'"
    )


def test_the_old_to_new_table_names_gone_modules_and_their_new_homes() -> None:
    for before, after in rename_rows():
        assert before, f"a row of '{OLD_TO_NEW}' names no old module: {before} -> {after}"
        assert after, f"a row of '{OLD_TO_NEW}' names no new module: {before} -> {after}"
        for name in before:
            assert not (PACKAGE / name).exists(), f"`{name}` is in the left column but still exists"
        for name in after:
            assert (PACKAGE / name).is_file(), f"`{name}` is in the right column but does not exist"
