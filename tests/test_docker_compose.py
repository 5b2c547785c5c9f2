"""docker-compose.yml describes the cluster the integration suite expects and the docs name
(and docker-compose.sharded.yml its two-shard counterpart, checked at the end).

No Docker engine runs here, so the file is checked as data: three clickhouse-server replicas and
one Keeper of one pinned release, HTTP on loopback, healthchecks, and configuration files whose
names agree (hostnames, macros, the remote_servers cluster, the Keeper address); every
``ch-N[:PORT]`` the README and docs/ use is a service of it listening on that port; the
``cluster_host_map`` it documents for discovery from the host is the one its ports make. Where a
compose CLI is installed (Debian's ``docker-compose`` needs no engine for this), its own
validation (``config``) must pass and its reading of the file must agree.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
REPLICAS = ["r1", "r2", "r3"]


def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    return document


def services() -> dict[str, Any]:
    result = compose()["services"]
    assert isinstance(result, dict)
    return result


def servers() -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in services().items() if name != "keeper"}


def mounted(spec: dict[str, Any], target_suffix: str) -> Path:
    for volume in spec["volumes"]:
        source, target = volume.split(":")[:2]
        if target.endswith(target_suffix):
            return (ROOT / source).resolve()
    raise AssertionError(f"no volume mounted at *{target_suffix}: {spec['volumes']}")


def test_three_replicas_and_a_keeper_of_one_pinned_release() -> None:
    names = set(services())
    assert names == {"keeper", "ch-1", "ch-2", "ch-3"}  # the docs' host names
    images = {name: spec["image"] for name, spec in services().items()}
    tags = {image.rpartition(":")[2] for image in images.values()}
    assert len(tags) == 1, images  # one release for the servers and Keeper
    (tag,) = tags
    assert tag not in ("", "latest"), images
    assert images["keeper"].startswith("clickhouse/clickhouse-keeper:")
    for name, spec in servers().items():
        assert spec["image"].startswith("clickhouse/clickhouse-server:"), name


def test_http_ports_are_published_on_loopback_and_healthchecked() -> None:
    published = []
    for name, spec in servers().items():
        (port,) = spec["ports"]
        host_ip, host_port, container_port = str(port).split(":")
        assert (host_ip, container_port) == ("127.0.0.1", "8123"), name
        published.append(int(host_port))
        assert "/ping" in " ".join(spec["healthcheck"]["test"]), name
        assert spec["depends_on"]["keeper"]["condition"] == "service_healthy", name
    assert sorted(published) == [8123, 8124, 8125]
    assert services()["keeper"]["healthcheck"]["test"]


def test_configuration_files_exist_and_agree() -> None:
    keeper_host = services()["keeper"]["hostname"]
    hostnames = sorted(spec["hostname"] for spec in servers().values())
    for index, (name, spec) in enumerate(sorted(servers().items())):
        replica = ET.parse(mounted(spec, "/replica.xml")).getroot()
        assert replica.findtext("macros/replica") == REPLICAS[index], name
        assert replica.findtext("display_name") == REPLICAS[index], name
        assert replica.findtext("macros/shard")
        cluster = ET.parse(mounted(spec, "/cluster.xml")).getroot()
        assert cluster.findtext("zookeeper/node/host") == keeper_host
        (shard,) = cluster.findall("remote_servers/*/shard")
        assert sorted(r.findtext("host") or "" for r in shard.findall("replica")) == hostnames
    keeper = mounted(services()["keeper"], "/keeper_config.xml")
    assert ET.parse(keeper).getroot().find(".//keeper_server") is not None


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DOC_HOST = re.compile(r"(?<![\w.-])(ch-\d+)(?::(\d+))?(?![\w-])")


def inside_ports(spec: dict[str, Any]) -> set[int]:
    """The ports a service listens on inside the compose network: the container side of
    ``ports`` and the ``expose`` list."""
    published = {int(str(p).split("/")[0].rpartition(":")[2]) for p in spec.get("ports", [])}
    return published | {int(str(p).split("/")[0]) for p in spec.get("expose", [])}


def network_names(name: str, spec: dict[str, Any]) -> set[str]:
    """What a service answers to on the compose network: its name, hostname and aliases."""
    names = {name, spec.get("hostname", name)}
    networks = spec.get("networks") or {}
    if isinstance(networks, dict):
        for network in networks.values():
            names.update((network or {}).get("aliases", []))
    return names


def test_every_host_and_port_the_docs_use_is_in_the_compose_file() -> None:
    listening: dict[str, set[int]] = {}
    for name, spec in servers().items():
        for alias in network_names(name, spec):
            listening[alias] = inside_ports(spec)
    used = []
    wrong = []
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in DOC_HOST.finditer(line):
                host, port = match.group(1), match.group(2)
                used.append(match.group(0))
                where = f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
                if host not in listening:
                    wrong.append(f"{where} (no such service)")
                elif port is not None and 0 < int(port) < 65536 and int(port) not in listening[host]:
                    # (a port out of range is an example of the error it causes, not an address)
                    wrong.append(f"{where} (listens on {sorted(listening[host])})")
    assert len(used) > 50  # the scan sees the examples
    assert wrong == []


def test_the_documented_host_map_is_the_one_the_ports_make() -> None:
    from clickhouse_lb.core.discovery import http_port_for
    from clickhouse_lb.testing.docker import DockerCluster

    made = {}
    for spec in servers().values():
        (port,) = spec["ports"]
        host_ip, host_port, container_port = str(port).split(":")
        made[f"{spec['hostname']}:{container_port}"] = f"{host_ip}:{host_port}"
    assert DockerCluster().host_map == made
    # system.clusters lists remote_servers' host:9000; the port rule makes it the map's key.
    cluster = ET.parse(mounted(next(iter(servers().values())), "/cluster.xml")).getroot()
    listed = {f"{r.findtext('host')}:{http_port_for(int(r.findtext('port') or 0))}"
              for r in cluster.findall("remote_servers/*/shard/replica")}
    assert listed == set(made)
    # The map the file's header comment shows, as written there.
    header = "".join(line.lstrip("#").strip() for line in COMPOSE.read_text().splitlines() if line.startswith("#"))
    shown = re.search(r"cluster_host_map=(\{[^}]*\})", header)
    assert shown is not None
    assert ast.literal_eval(shown.group(1)) == made


def test_compose_cli_accepts_the_file_where_one_is_installed() -> None:
    """Runs ``docker compose config`` or ``docker-compose config`` when either exists (neither
    needs a running engine for this); the checks above hold either way."""
    ran = False
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) is None:
            continue
        probe = subprocess.run([*command, "version"], capture_output=True, text=True, timeout=60, check=False)
        if probe.returncode != 0:
            continue  # e.g. a docker client without the compose plugin
        result = subprocess.run(
            [*command, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, result.stderr
        ran = True
        # The CLI's reading (anchors merged, ports normalised) agrees with the checks above.
        resolved = yaml.safe_load(result.stdout)["services"]
        assert set(resolved) == set(services())
        for name, spec in servers().items():
            assert inside_ports(resolved[name]) == inside_ports(spec), name
            assert resolved[name]["hostname"] == spec["hostname"] == name
    # CI installs Debian's docker-compose (.ci/run): there the check must have run.
    assert ran or not os.environ.get("CI"), "no compose CLI answered: .ci/run installs Debian's docker-compose"


# -- docker-compose.sharded.yml: two shards of two replicas ---------------------------------------
SHARDED = ROOT / "docker-compose.sharded.yml"
SHARDED_REPLICAS = {"r1": "01", "r2": "01", "r3": "02", "r4": "02"}  # as LocalCluster(shards=2, replicas=2)


def sharded_services() -> dict[str, Any]:
    document = yaml.safe_load(SHARDED.read_text())
    assert isinstance(document, dict)
    result = document["services"]
    assert isinstance(result, dict)
    return result


def sharded_servers() -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in sharded_services().items() if name.startswith("clickhouse-")}


def test_sharded_file_has_four_servers_and_a_keeper_of_the_same_release_as_the_main_file() -> None:
    assert set(sharded_services()) == {"keeper", *(f"clickhouse-{r}" for r in SHARDED_REPLICAS)}
    images = {spec["image"] for spec in sharded_services().values()}
    main_tag = services()["keeper"]["image"].rpartition(":")[2]
    assert {image.rpartition(":")[2] for image in images} == {main_tag}, images
    assert "-p clickhouse-lb-sharded" in SHARDED.read_text()  # a project of its own, said how to start it


def test_sharded_ports_are_on_loopback_apart_from_the_main_file_and_healthchecked() -> None:
    main_ports = {int(str(spec["ports"][0]).split(":")[1]) for spec in servers().values()}
    published = []
    for name, spec in sharded_servers().items():
        (port,) = spec["ports"]
        host_ip, host_port, container_port = str(port).split(":")
        assert (host_ip, container_port) == ("127.0.0.1", "8123"), name
        published.append(int(host_port))
        assert "/ping" in " ".join(spec["healthcheck"]["test"]), name
        assert spec["depends_on"]["keeper"]["condition"] == "service_healthy", name
    assert len(set(published)) == 4
    assert not set(published) & main_ports


def test_sharded_configuration_has_two_shards_whose_replicas_carry_their_shard_macro() -> None:
    keeper_host = sharded_services()["keeper"]["hostname"]
    shard_of_host: dict[str, str] = {}
    cluster_files = set()
    for name, spec in sorted(sharded_servers().items()):
        replica_name = name.removeprefix("clickhouse-")
        replica = ET.parse(mounted(spec, "/replica.xml")).getroot()
        assert replica.findtext("macros/replica") == replica_name, name
        assert replica.findtext("display_name") == replica_name, name
        assert replica.findtext("macros/shard") == SHARDED_REPLICAS[replica_name], name
        assert replica.findtext("interserver_http_host") == spec["hostname"], name
        shard_of_host[spec["hostname"]] = SHARDED_REPLICAS[replica_name]
        cluster_files.add(mounted(spec, "/cluster.xml"))
    (cluster_file,) = cluster_files  # one remote_servers for all four
    cluster = ET.parse(cluster_file).getroot()
    assert cluster.findtext("zookeeper/node/host") == keeper_host
    assert cluster.findtext("default_replica_path") == "/clickhouse/tables/{uuid}/{shard}"
    shards = cluster.findall("remote_servers/lb_cluster/shard")
    assert len(shards) == 2
    for number, shard in enumerate(shards, start=1):
        hosts = [r.findtext("host") or "" for r in shard.findall("replica")]
        assert len(hosts) == 2
        assert {shard_of_host[h] for h in hosts} == {f"{number:02d}"}  # each shard's replicas, shard macro
        assert int(shard.findtext("weight") or "1") >= 0
        assert shard.findtext("internal_replication") == "true"
    keeper = mounted(sharded_services()["keeper"], "/keeper_config.xml")
    assert ET.parse(keeper).getroot().find(".//keeper_server") is not None


def test_compose_cli_accepts_the_sharded_file_where_one_is_installed() -> None:
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) is None:
            continue
        probe = subprocess.run([*command, "version"], capture_output=True, text=True, timeout=60, check=False)
        if probe.returncode != 0:
            continue
        result = subprocess.run(
            [*command, "-f", str(SHARDED), "config", "-q"], capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, result.stderr
