"""The README stays a front page: short, its two commands first and unchanged (CI's .ci/run runs
the same test command), and every link into the repository pointing at a file that exists. The
reference lives in the documentation site (mkdocs.yml, docs/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

TWO_COMMANDS = """```bash
# Main job: a local 3-replica ClickHouse cluster (real engine, no server, no Docker) and the pool at work
python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[local]' && clickhouse-lb demo

# The whole test suite: unit tests, then integration tests against a local cluster the tests start
python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && pytest
```"""


def test_the_readme_is_at_most_250_lines() -> None:
    assert len(README.splitlines()) <= 250


def test_the_two_commands_come_first_unchanged() -> None:
    first_block = re.search(r"```bash\n.*?\n```", README, re.DOTALL)
    assert first_block is not None
    assert first_block.group(0) == TWO_COMMANDS
    assert README.index(TWO_COMMANDS) < README.index("\n## ")  # before any section
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^pytest$", ci, re.MULTILINE), ".ci/run no longer runs the README's test command"


def test_every_relative_link_names_a_file_that_exists() -> None:
    links = re.findall(r"\]\((?!https?://|#)([^)#\s]+)(?:#[^)]*)?\)", README)
    assert links, "the README links into the docs"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert missing == []
