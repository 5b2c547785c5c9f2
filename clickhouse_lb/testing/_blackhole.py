"""A network black hole for one local replica: its address takes connections that never complete.

A SIGSTOPped process still completes TCP handshakes (the kernel answers SYNs), so it does not
exercise a client's *connect* timeout. Here the replica's listening socket is replaced by one
with ``listen(0)`` whose accept queue is filled by a connection of our own and never accepted:
Linux then drops every further SYN to that address (``tcp_abort_on_overflow`` = 0, the default),
so a client's ``connect()`` hangs until its own timeout, exactly as with a dropped-packets
firewall rule. Established connections go silent as well (the server stops answering them).
No root, iptables or network namespace is needed.

Driven by signals from the cluster (SIGUSR1: enter, SIGUSR2: leave); the replica writes
``blackhole.state`` (``on``/``off``) in its data directory once the switch is done.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from clickhouse_lb.testing._http import HttpServer

if TYPE_CHECKING:
    from clickhouse_lb.testing.server import ReplicaServer

STATE_FILE = "blackhole.state"
ENTER_SIGNAL = signal.SIGUSR1
LEAVE_SIGNAL = signal.SIGUSR2


class BlackHole:
    """Holds ``host:port`` with a listener whose accept queue is full."""

    def __init__(self, host: str, port: int) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(0)
        self.fillers: list[socket.socket] = []
        for _ in range(8):  # listen(0) queues one connection; a few more in case the kernel allows them
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect((host, port))
            _, writable, _ = select.select([], [filler], [], 0.2)
            if writable and filler.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                self.fillers.append(filler)
                continue
            filler.close()  # its SYN was dropped: the queue is full
            break

    def close(self) -> None:
        for filler in self.fillers:
            filler.close()
        self.listener.close()


class _Control:
    """What the signal handlers ask for. A handler runs on the main thread between two bytecodes,
    so it takes no lock and starts no thread (a lock held by the code it interrupted, such as an
    Event's or the one ``Thread.start`` takes, would deadlock it): it sets a flag and writes a
    byte to a pipe. A control thread reads the pipe and does the rest: it stops the HTTP server
    (the main thread then opens the black hole) and wakes the main thread's wait in the hole."""

    def __init__(self, server: ReplicaServer) -> None:
        self.server = server
        self.want_hole = False
        self.stopping = False
        self.changed = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._shutdown_asked = False
        threading.Thread(target=self._run, name="blackhole-control", daemon=True).start()

    # -- signal handlers: flags and a byte, nothing else -------------------------------------
    def enter(self, _signum: int = 0, _frame: object = None) -> None:
        self.want_hole = True
        self._wake()

    def leave(self, _signum: int = 0, _frame: object = None) -> None:
        self.want_hole = False
        self._wake()

    def stop(self, _signum: int = 0, _frame: object = None) -> None:
        self.stopping = True
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe wakes the reader anyway
            os.write(self._wake_write, b"!")

    # -- the control thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            os.read(self._wake_read, 512)
            if (self.want_hole or self.stopping) and not self._shutdown_asked:
                self._shutdown_asked = True
                # serve_forever returns; shutdown() waits for that (on its own thread: it never
                # returns if the server is not serving at that moment).
                threading.Thread(target=self.server.http.shutdown, daemon=True).start()
            self.changed.set()

    def served_again(self) -> None:
        """The main thread serves again (after a black hole): the next hole needs a shutdown."""
        self._shutdown_asked = False
        if self.want_hole or self.stopping:  # asked again while the server was being rebuilt
            self._wake()

    def is_stopping(self) -> bool:
        return self.stopping

    def holding(self) -> bool:
        """Whether the black hole is to stay."""
        return self.want_hole and not self.stopping


def _write_state(data_dir: Path, state: str) -> None:
    tmp = data_dir / (STATE_FILE + ".tmp")
    tmp.write_text(state)
    os.replace(tmp, data_dir / STATE_FILE)


def serve(server: ReplicaServer, host: str, data_dir: Path) -> _Control:
    """Prepare ``server`` (a ReplicaServer) for black-holing; return the control to serve with."""
    control = _Control(server)
    signal.signal(ENTER_SIGNAL, control.enter)
    signal.signal(LEAVE_SIGNAL, control.leave)
    _write_state(data_dir, "off")
    return control


def serve_forever(control: _Control, host: str, data_dir: Path) -> None:
    """Serve until stopped, switching between serving and the black hole on request."""
    server = control.server
    port = server.port
    while True:
        server.serve_forever()
        if control.stopping or not control.want_hole:
            return
        server.http.server_close()
        server.set_blackholed(True)
        hole = BlackHole(host, port)
        _write_state(data_dir, "on")
        while control.holding():
            control.changed.wait(0.5)
            control.changed.clear()
        hole.close()
        if control.is_stopping():
            return
        server.http = HttpServer((host, port), server.handle)
        server.set_blackholed(False)
        control.served_again()
        _write_state(data_dir, "off")
