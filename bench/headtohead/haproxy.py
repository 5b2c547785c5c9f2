"""HAProxy in front of the local cluster: the config text (pure) and the process.

Two profiles, as the issue asks, plus the tuned profile with ``leastconn`` for the slow-replica
scenario. Each profile is one frontend on its own loopback port with its own backend, so their
health checks are independent; one HAProxy process serves them all.
"""

from __future__ import annotations

import atexit
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PROFILES", "HAProxy", "HAProxyProfile", "find_haproxy", "haproxy_config", "haproxy_version"]


@dataclass(frozen=True)
class HAProxyProfile:
    """One frontend/backend pair. ``backend_lines`` go into the backend section verbatim."""

    name: str
    description: str
    balance: str = "roundrobin"
    backend_lines: tuple[str, ...] = ()
    server_options: str = "check"


#: HAProxy's defaults: checks every 2 s, 3 failures to mark down, 2 successes to mark up; the
#: timeouts are those of Debian's stock haproxy.cfg (connect 5 s, client/server 50 s).
DEFAULT = HAProxyProfile(
    name="haproxy_default",
    description="HAProxy defaults + option httpchk GET /ping (inter 2s fall 3 rise 2; timeouts 5s/50s)",
)
#: Fast checks, short timeouts, a failed request re-sent to another server.
TUNED = HAProxyProfile(
    name="haproxy_tuned",
    description=(
        "checks inter 200ms fall 2 rise 1, timeout connect 200ms / server 1s / check 200ms, "
        "option redispatch, retries 2, retry-on conn-failure empty-response response-timeout"
    ),
    backend_lines=(
        "option redispatch",
        "retries 2",
        "retry-on conn-failure empty-response response-timeout",
        "timeout connect 200ms",
        "timeout server 1s",
        "timeout check 200ms",
    ),
    server_options="check inter 200ms fastinter 100ms downinter 200ms fall 2 rise 1",
)
#: The tuned profile with ``balance leastconn`` (the load-aware choice HAProxy users make).
LEASTCONN = HAProxyProfile(
    name="haproxy_leastconn",
    description="the tuned profile with balance leastconn",
    balance="leastconn",
    backend_lines=TUNED.backend_lines,
    server_options=TUNED.server_options,
)
PROFILES: tuple[HAProxyProfile, ...] = (DEFAULT, TUNED, LEASTCONN)


def haproxy_config(
    profiles: Sequence[HAProxyProfile],
    servers: Sequence[tuple[str, str]],
    ports: Sequence[int],
    *,
    bind_host: str = "127.0.0.1",
) -> str:
    """The whole haproxy.cfg: one frontend per profile on ``ports[i]``, ``servers`` as
    ``(name, "host:port")``. Health checks ask ``GET /ping`` (ClickHouse's liveness URL)."""
    if len(profiles) != len(ports):
        raise ValueError(f"one port per profile: {len(profiles)} profiles, {len(ports)} ports")
    if not servers:
        raise ValueError("no servers")
    lines = [
        "global",
        "    maxconn 4096",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout client 50s",
        "    timeout server 50s",
    ]
    for profile, port in zip(profiles, ports):
        lines += [
            "",
            f"frontend fe_{profile.name}",
            f"    bind {bind_host}:{port}",
            f"    default_backend be_{profile.name}",
            "",
            f"backend be_{profile.name}",
            f"    balance {profile.balance}",
            "    option httpchk GET /ping",
            *(f"    {line}" for line in profile.backend_lines),
            *(f"    server {name} {address} {profile.server_options}" for name, address in servers),
        ]
    return "\n".join(lines) + "\n"


def find_haproxy() -> str | None:
    return shutil.which("haproxy")


def haproxy_version(binary: str) -> str:
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0].strip() if out else "unknown"


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n ports the kernel hands out as free right now (HAProxy cannot bind port 0 and report it)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class HAProxy:
    """A foreground HAProxy process (``-db``) serving ``profiles``; a context manager."""

    binary: str
    servers: Sequence[tuple[str, str]]
    profiles: Sequence[HAProxyProfile] = PROFILES
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=dict)
    _proc: subprocess.Popen[bytes] | None = None
    _dir: Path | None = None

    def start(self, timeout: float = 10.0) -> HAProxy:
        self._dir = Path(tempfile.mkdtemp(prefix="clickhouse-lb-haproxy-"))
        ports = free_ports(len(self.profiles), self.host)
        self.ports = {p.name: port for p, port in zip(self.profiles, ports)}
        cfg = self._dir / "haproxy.cfg"
        cfg.write_text(haproxy_config(self.profiles, self.servers, ports, bind_host=self.host))
        check = subprocess.run([self.binary, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True, check=False)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected {cfg}:\n{check.stdout}{check.stderr}")
        log = open(self._dir / "haproxy.log", "wb")  # noqa: SIM115 - kept open for the process's life
        self._proc = subprocess.Popen([self.binary, "-db", "-f", str(cfg)], stdout=log, stderr=log,
                                      stdin=subprocess.DEVNULL)
        # Stopped by close() (compare.py's finally), and at interpreter exit as a last resort.
        # (PR_SET_PDEATHSIG did not survive HAProxy's start-up here: a SIGKILLed benchmark
        # leaves HAProxy running.)
        atexit.register(self.close)
        log.close()
        deadline = time.monotonic() + timeout
        for port in ports:
            while not _accepts(self.host, port):
                if self._proc.poll() is not None:
                    raise RuntimeError(f"haproxy exited: {(self._dir / 'haproxy.log').read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"haproxy did not listen on {self.host}:{port} within {timeout}s")
                time.sleep(0.05)
        return self

    def address(self, profile: str) -> tuple[str, int]:
        return self.host, self.ports[profile]

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> HAProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False
