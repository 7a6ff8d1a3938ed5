"""`mailroom send --workers N`: N sender processes forked from one (mailroom.outbound.workers), each
claiming with SKIP LOCKED and reporting under its own name; with --until-idle the set ends when the
queue is drained."""

from __future__ import annotations

import collections
import signal
import socket
import time
import urllib.request

from outbound_support import SEND_FLAGS, add_sender, counts, enqueue_many, free_port


def _senders(conn) -> dict[str, int]:
    return dict(conn.execute(
        "SELECT worker, claimed FROM mailroom.worker_health() WHERE kind = 'sender'").fetchall())


def test_workers_drain_the_queue_once_each_message_in_their_own_processes(conn, cli, smtp_server):
    n = 600
    server = smtp_server(delay=0.002)
    add_sender(conn, server.port)
    enqueue_many(conn, n)
    result = cli("send", "--until-idle", *SEND_FLAGS, "--workers", "3", "--concurrency", "1", "--batch-size", "20",
                 "--worker", "drain", timeout=120)
    assert result.returncode == 0, result.stderr
    assert counts(conn) == {"sent": n}
    delivered = collections.Counter(server.handler.message_ids())
    assert len(delivered) == n and set(delivered.values()) == {1}
    # three processes, each under its own name, and between them every claim
    senders = _senders(conn)
    assert set(senders) == {"drain-1", "drain-2", "drain-3"}, senders
    assert sum(senders.values()) == n
    assert "3 sender processes started" in result.stderr and "stopped (3 sender processes)" in result.stderr
    assert result.stderr.count("sender drain-") >= 3  # each worker's own start line


def _named(conn, name: str) -> set[str]:
    return {s for s in _senders(conn) if s.startswith(name + "-")}


def _two_free_ports() -> int:
    """A port that is free, and the next one too (a parallel test may still take either)."""
    while True:
        port = free_port()
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue


def test_each_worker_serves_its_own_metrics_and_sigterm_stops_them_all(conn, cli_popen, smtp_server):
    """(A worker that dies is started again by the supervisor's policy, tests/ops/test_supervisor.py,
    whose children are forked functions as these are.)"""
    server = smtp_server()
    add_sender(conn, server.port)
    for attempt in range(1, 4):
        port = _two_free_ports()
        name = f"pair{attempt}"
        proc = cli_popen("send", *SEND_FLAGS, "--workers", "2", "--worker", name, "--metrics-port", str(port))
        deadline = time.monotonic() + 30
        while len(_named(conn, name)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if proc.poll() is None:
            break
        # a parallel test took one of the two ports between the probe and the bind: the set stops
        # (a worker that fails within 5 s of its start), as it must; try two other ports
        err = proc.stderr.read().decode()
        assert "Address already in use" in err, err
    assert _named(conn, name) == {f"{name}-1", f"{name}-2"}
    for p in (port, port + 1):  # each worker serves its own metrics, on consecutive ports
        with urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5) as resp:
            assert b"mailroom_worker_info" in resp.read()
    children = [int(p) for p in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]
    assert len(children) == 2  # the parent holds no database connection: the two report in above
    enqueue_many(conn, 5)
    deadline = time.monotonic() + 30
    while counts(conn).get("sent", 0) < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counts(conn) == {"sent": 5}
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert b"stopped (2 sender processes)" in err
    assert {s for (s,) in conn.execute("SELECT state FROM mailroom.worker_health() WHERE kind = 'sender'")} == {"stopped"}
