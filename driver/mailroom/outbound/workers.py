"""`mailroom send --workers N`: N sender processes forked from one, supervised by it.

One sender is one process and, Python being what it is, one core at most; `--concurrency` gives it
parallel slots on that core. On more cores, more senders: as separate commands they are separate
interpreters, each with its own copy of every module it imports (~33 MiB PSS each, issue 46: four
held 131 MiB against Postfix's 73.5 draining the same burst). Here the parent imports the sender,
loads the relay-password and DKIM keys once, freezes what it loaded out of the cyclic collector
(mailroom.core.supervisor.freeze_loaded), and forks the workers, which share those pages copy-on-write.

The parent holds no database connection and no event loop (the key check at start closed its own):
each worker connects after the fork, claims with SKIP LOCKED like any other sender, and reports its
own heartbeat under its own name (host:pid, or `--worker NAME` with `-1`, `-2`, ... appended). Its
metrics port is `--metrics-port` plus its index (0: any free port each). The policy is the
supervisor's (mailroom.core.supervisor): a worker that dies on its own is started again; with
`--until-idle` the set is finite, and the command exits once every worker found nothing due.
Readiness (MAILROOM_READY_FD, NOTIFY_SOCKET) is said by the first worker that has claimed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mailroom.core import eventloop
from mailroom.core.log import get_logger
from mailroom.core.supervisor import Child, Supervisor, freeze_loaded
from mailroom.outbound.sender import Sender, SenderOptions

log = get_logger("send")


def options_of(opts: SenderOptions, index: int) -> SenderOptions:
    """Worker `index`'s options (0-based): its own name when one was given, its own metrics port."""
    port = opts.metrics_port
    return dataclasses.replace(
        opts,
        worker=f"{opts.worker}-{index + 1}" if opts.worker else "",
        metrics_port=port + index if port else port,
    )


def supervise(opts: SenderOptions, workers: int, new_loop: eventloop.LoopFactory = None) -> int:
    """Fork `workers` senders, each on the event loop `new_loop` makes, and supervise them; the exit status."""

    def target_of(index: int) -> Callable[[], int]:
        def target() -> int:
            eventloop.run(Sender(options_of(opts, index)).run(), new_loop)
            return 0

        return target

    # this module's imports are the sender's (its SMTP client, renderer, DKIM signer ...; the command's
    # module imported them first): nothing more to import before the fork
    freeze_loaded()
    children = [Child(f"sender {n}", target=target_of(n - 1)) for n in range(1, workers + 1)]
    # each worker finishes its in-flight SMTP (--shutdown-grace) before it exits
    sup = Supervisor(children, restart=not opts.until_idle, finite=opts.until_idle,
                     stop_grace=opts.shutdown_grace + 10, log_name="send")
    code = sup.run(lambda: log.info("%d sender processes started", workers))
    log.info("stopped (%d sender processes)", workers)
    return code
