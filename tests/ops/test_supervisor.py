"""mailroom.core.supervisor: the one policy of `mailroom run` and `mailroom inbox serve --workers N`.

Children here are forked functions that write a line to a file when they start, so the tests see
every start; the start-up window is shortened to keep them quick.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mailroom.core.errors import UserError
from mailroom.core.supervisor import Child, Supervisor


def _child(name: str, starts: Path, *, lives: float | None) -> Child:
    def target() -> int:
        with starts.open("a") as f:
            f.write(f"{name} {os.getpid()}\n")
        if lives is None:
            while True:
                time.sleep(1)
        time.sleep(lives)
        return 3

    return Child(name, target=target)


def _starts(path: Path) -> list[str]:
    return path.read_text().split()[0::2] if path.exists() else []


def _signal_later(seconds: float) -> None:
    threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM)).start()


def test_a_child_that_dies_later_is_restarted_with_restart(tmp_path):
    starts = tmp_path / "starts"
    sup = Supervisor([_child("a", starts, lives=0.4), _child("b", starts, lives=None)], restart=True,
                     startup_seconds=0.2, stop_grace=2)
    _signal_later(3.0)
    assert sup.run() == 0
    names = _starts(starts)
    assert names.count("a") >= 2, names  # died after its start-up window: started again
    assert names.count("b") == 1, names
    assert all(not c.running() for c in sup.children)


def test_without_restart_a_death_stops_the_others(tmp_path):
    starts = tmp_path / "starts"
    sup = Supervisor([_child("a", starts, lives=0.4), _child("b", starts, lives=None)], restart=False,
                     startup_seconds=0.2, stop_grace=2)
    started = time.monotonic()
    assert sup.run() == 1
    assert time.monotonic() - started < 5
    # each started once, a first: the supervisor's order is the order it forks in (the order the
    # forked children then write their lines is the scheduler's, and varied under load in CI)
    assert sorted(_starts(starts)) == ["a", "b"]
    a, b = sup.children
    assert a.started_at < b.started_at
    assert a.returncode == 3
    assert b.returncode == -signal.SIGTERM  # stopped by the supervisor


def test_a_death_within_the_start_up_window_stops_everything_even_with_restart(tmp_path):
    starts = tmp_path / "starts"
    sup = Supervisor([_child("a", starts, lives=0.0), _child("b", starts, lives=None)], restart=True,
                     startup_seconds=3, stop_grace=2)
    assert sup.run() == 1
    assert _starts(starts).count("a") == 1


def test_a_failed_ready_check_stops_what_was_started(tmp_path):
    starts = tmp_path / "starts"

    def never_ready(child: Child) -> None:
        raise UserError(f"{child.name} does not serve")

    first = _child("a", starts, lives=None)
    second = _child("b", starts, lives=None)
    second.ready = never_ready
    sup = Supervisor([first, second], startup_seconds=0.2, stop_grace=2)
    with pytest.raises(UserError, match="b does not serve"):
        sup.run()
    assert not first.running() and not second.running()


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_with_its_stacks_written(tmp_path, capfd, caplog):
    def stuck_in_here() -> None:
        while True:
            time.sleep(1)

    def stubborn() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        threading.Thread(target=stuck_in_here, name="helper", daemon=True).start()
        stuck_in_here()

    sup = Supervisor([Child("stubborn", target=stubborn)], startup_seconds=0.1, stop_grace=0.5)
    _signal_later(0.5)
    started = time.monotonic()
    assert sup.run() == 0
    assert sup.children[0].returncode == -signal.SIGKILL
    assert time.monotonic() - started < 5
    err = capfd.readouterr().err
    # where it hung, before it was killed (the collector that once did not stop, CI on ac7884d, said nothing)
    assert "stubborn did not stop within 0s; its threads' stacks follow, then it is killed" in caplog.text
    assert err.count("in stuck_in_here") == 2  # both threads
    assert "Current thread" in err  # faulthandler's header of the main thread's stack


def test_a_supervised_command_writes_its_stacks_on_sigquit_and_goes_on(tmp_path):
    """`python -m mailroom` started by a supervisor (MAILROOM_SUPERVISOR_PID) registers the stacks
    signal first thing; one waiting for an unreachable database answers it and keeps waiting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env.update(MAILROOM_DATABASE_URL="postgresql://mailroom@127.0.0.1:1/nothing", MAILROOM_SUPERVISOR_PID=str(os.getpid()))
    err = tmp_path / "err"
    with err.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "mailroom", "collect"], env=env, stdout=subprocess.DEVNULL,
                                stderr=f)
    try:
        deadline = time.monotonic() + 30
        while "configured" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGQUIT)
        while "collector.py" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "collector.py" in err.read_text()
        assert proc.poll() is None  # it goes on
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_finite_set_ends_when_every_child_is_done(tmp_path):
    """send --workers N --until-idle: a child that exits 0 is done (not restarted, not a failure even
    within the start-up window); the supervisor returns 0 once all are."""
    starts = tmp_path / "starts"

    def done_after(name: str, seconds: float) -> Child:
        def target() -> int:
            with starts.open("a") as f:
                f.write(f"{name} {os.getpid()}\n")
            time.sleep(seconds)
            return 0

        return Child(name, target=target)

    sup = Supervisor([done_after("quick", 0), done_after("slow", 1.0)], startup_seconds=5, stop_grace=2, restart=True,
                     finite=True)
    started = time.monotonic()
    assert sup.run() == 0
    assert 1.0 <= time.monotonic() - started < 5
    assert sorted(_starts(starts)) == ["quick", "slow"]  # each once
    assert all(c.done and c.returncode == 0 for c in sup.children)


def test_a_finite_set_stops_the_others_when_one_fails(tmp_path):
    starts = tmp_path / "starts"
    sup = Supervisor([_child("fails", starts, lives=0.3), _child("forever", starts, lives=None)],
                     startup_seconds=0.1, stop_grace=2, restart=False, finite=True)
    assert sup.run() == 1
    assert sup.children[1].returncode == -signal.SIGTERM
