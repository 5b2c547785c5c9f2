"""Real Alembic commands (upgrade, current, history, downgrade, upgrade again) through a
``clickhousedb+lb://`` URL with random balancing over 3 local replicas, a replica killed between
commands: the migration state is the same every time. The env.py is the one ``alembic init``
writes, plus ``import clickhouse_lb.alembic``; the URL goes through Alembic's configparser as
``engine.url.render_as_string(hide_password=False)`` renders it (``str(engine.url)`` hides the
password).

Two modes (clickhouse_lb.sqlalchemy._alembic): with ``cluster=`` the version table is replicated
ON CLUSTER and any replica answers; without it every run is pinned to the URL's first replica,
and fails naming it while it is down."""

from __future__ import annotations

import io
import logging
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy import create_engine

from clickhouse_lb.testing import ClusterBase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REVISIONS = ("a1", "b2")


@pytest.fixture(autouse=True)
def _loggers_left_as_found() -> Iterator[None]:
    """The stock env.py calls ``logging.config.fileConfig``, which disables every logger that
    already exists (``clickhouse_lb``'s included) in this process: undone after each test, so
    that later tests still see the library's records."""
    def loggers() -> list[logging.Logger]:
        return [x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)]

    # (a logger made during the test, as clickhouse_lb's is on first use, was enabled before it)
    disabled_before = {id(x) for x in loggers() if x.disabled}
    root_level, root_handlers = logging.root.level, list(logging.root.handlers)
    yield
    for x in loggers():
        if id(x) not in disabled_before:
            x.disabled = False
    logging.root.setLevel(root_level)
    logging.root.handlers[:] = root_handlers


@pytest.fixture
def cluster(healthy_clickhouse_cluster: ClusterBase) -> ClusterBase:
    return healthy_clickhouse_cluster


@pytest.fixture
def database(cluster: ClusterBase) -> Iterator[str]:
    name = f"mig_{uuid.uuid4().hex[:10]}"
    cluster.on_all(f"CREATE DATABASE {name}")
    yield name
    cluster.heal()
    cluster.on_all(f"DROP DATABASE IF EXISTS {name}")


def _migration(revision: str, down: str | None, upgrade: str, downgrade: str) -> str:
    return textwrap.dedent(
        f'''\
        from alembic import op

        revision = "{revision}"
        down_revision = {down!r}
        branch_labels = None
        depends_on = None


        def upgrade():
            op.execute("""{upgrade}""")


        def downgrade():
            op.execute("""{downgrade}""")
        '''
    )


def alembic_project(tmp_path: Path, url: str, on_cluster: str | None) -> Config:
    """``alembic init`` in tmp_path, the one line added to its env.py, two migrations."""
    stdout = io.StringIO()
    config = Config(str(tmp_path / "alembic.ini"), stdout=stdout)
    command.init(config, str(tmp_path / "migrations"))
    env = tmp_path / "migrations" / "env.py"
    env.write_text("import clickhouse_lb.alembic  # noqa: F401\n" + env.read_text())
    config = Config(str(tmp_path / "alembic.ini"), stdout=stdout)
    config.set_main_option("script_location", str(tmp_path / "migrations"))
    config.set_main_option("sqlalchemy.url", url)  # configparser: a '%' here would raise
    clause = f" ON CLUSTER {on_cluster}" if on_cluster else ""
    engine = "ReplicatedMergeTree" if on_cluster else "MergeTree"
    down: str | None = None
    for revision in REVISIONS:
        table = f"t_{revision}"
        (tmp_path / "migrations" / "versions" / f"{revision}.py").write_text(
            _migration(
                revision, down,
                f"CREATE TABLE {table}{clause} (n UInt32) ENGINE = {engine} ORDER BY n",
                f"DROP TABLE {table}{clause} SYNC",
            )
        )
        down = revision
    return config


def current(config: Config) -> str:
    stdout = config.stdout
    assert isinstance(stdout, io.StringIO)
    stdout.seek(0)
    stdout.truncate()
    command.current(config)
    return stdout.getvalue().strip()


def url_of(cluster: ClusterBase, database: str, extra: str = "") -> str:
    hosts = "&".join(f"host={h}" for h in cluster.hosts)
    engine = create_engine(f"clickhousedb+lb://default:@/{database}?{hosts}&load_balancing=random{extra}")
    rendered = engine.url.render_as_string(hide_password=False)  # str(engine.url) would give *** for the password
    engine.dispose()
    assert "%" not in rendered
    return rendered


def test_alembic_commands_without_cluster_are_pinned_to_the_first_replica(
    cluster: ClusterBase, database: str, tmp_path: Path
) -> None:
    config = alembic_project(tmp_path, url_of(cluster, database), on_cluster=None)
    command.upgrade(config, "head")
    assert current(config) == "b2 (head)"
    cluster.kill(1)  # not the migration replica: nothing changes
    for _ in range(3):
        assert current(config) == "b2 (head)"
    command.history(config)
    assert "a1 -> b2 (head)" in config.stdout.getvalue()  # type: ignore[union-attr]
    command.downgrade(config, "-1")
    assert current(config) == "a1"
    cluster.heal()
    cluster.kill(2)
    command.upgrade(config, "head")  # re-runs b2 only: no TABLE_ALREADY_EXISTS
    assert current(config) == "b2 (head)"
    cluster.heal()
    cluster.kill(0)  # the migration replica: a clear error, never another replica's state
    with pytest.raises(CommandError, match=r"migration replica .* is unavailable") as caught:
        command.current(config)
    assert "not tried" not in str(caught.value)  # the healthy replicas are not reported as down
    cluster.heal()
    assert current(config) == "b2 (head)"
    # The state lives on the first replica only, as documented.
    assert cluster.query(0, f"SELECT version_num FROM {database}.alembic_version").strip() == "b2"
    assert cluster.query(1, f"EXISTS TABLE {database}.alembic_version").strip() == "0"


def test_alembic_commands_with_cluster_share_one_replicated_version_table(
    cluster: ClusterBase, database: str, tmp_path: Path
) -> None:
    name = cluster.cluster_name
    config = alembic_project(tmp_path, url_of(cluster, database, f"&cluster={name}"), on_cluster=name)
    command.upgrade(config, "head")
    for victim in (0, 1, 2):  # each replica down in turn, the others answer with the one state
        cluster.kill(victim)
        for _ in range(3):
            assert current(config) == "b2 (head)"
        cluster.heal()
    command.downgrade(config, "-1")
    cluster.kill(0)
    for _ in range(3):
        assert current(config) == "a1"
    command.upgrade(config, "head")
    cluster.heal()
    cluster.kill(2)
    assert current(config) == "b2 (head)"
    cluster.heal()
    for i in range(3):  # one replicated table: a replica of it on every replica
        cluster.query(i, f"SYSTEM SYNC REPLICA {database}.alembic_version")
        assert cluster.query(
            i, f"SELECT count() FROM system.replicas WHERE database = '{database}' AND table = 'alembic_version'"
        ).strip() == "1"
        assert cluster.query(i, f"SELECT version_num FROM {database}.alembic_version").strip() == "b2"
