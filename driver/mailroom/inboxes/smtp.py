"""The SMTP protocol layer of `mailroom inbox serve`: aiosmtpd, its limits and its replies.

It asks mailroom.inboxes.delivery everything that needs the database and sends the reply:
- MAIL FROM / RCPT TO: the path is read in time linear in its length (mailroom.inboxes.addresses).
- RCPT TO: the recipient's verdict (`mailroom.check_bounce_recipient`: the mailbox's
  check_recipient verdict, or 'bounce' for a valid VERP return path). Unknown, deleted, expired →
  550 5.1.1; over the plan's size for a declared SIZE → 552 5.3.4; full → 552 5.2.2; more than
  --max-recipients → 452 4.5.3. A forged or unknown return path is 'unknown' (550 5.1.1, counted
  like any unknown recipient). A transaction is either for return paths or for mailboxes (the
  other kind gets 452 4.5.3: send it in another one).
- DATA is read by InboundSMTP.smtp_DATA, in blocks (not a readuntil per line). Every
  _SIZE_PROBE_BYTES past what is known to fit, it asks whether any accepted recipient's plan
  still takes the running size; when none does, the buffer
  is dropped, the rest is read and thrown away and the reply is 552 5.3.4 (the connection stays
  usable). So a message is never held past the largest limit of its recipients by more than one
  probe step; deliver_message still checks the exact size. Then the message (or the bounce) is
  delivered and its reply sent: 250 only after COMMIT.
- Abuse limits: --max-bad-recipients refused recipients per session, then 421 and hang up;
  --max-sessions connections at once, more get 421 before any database work; of those at most
  --max-sessions-per-client from one client address, its next one gets 421 at once (so one
  client's idle connections cannot keep every other sender out for the idle timeout); --idle-timeout.
- STARTTLS (RFC 3207) when the server has a certificate (--tls-cert/--tls-key), advertised in EHLO;
  with --require-tls every command but EHLO, NOOP, STARTTLS and QUIT gets 530 5.7.0 before it.
- SMTP AUTH PLAIN and LOGIN (mailroom.inboxes.auth, docs/inboxes.md "SMTP AUTH"; under --sink every
  login succeeds and captures nothing, mail stored by recipient as the sink stores it): offered on a
  loopback listener, elsewhere only after STARTTLS; required on a listener made with auth_required
  (`inbox serve --submission`), never on the port that receives internet mail. A session that logged
  in has a Capture: RCPT takes any address whose syntax is valid, and DATA stores the message once,
  in the capture inbox, whatever the recipients. Wrong credentials: 535 5.7.8 (SQL's reply), and past
  MAX_FAILURES of a client address in a minute its AUTH gets 454 4.7.0 until the window passes.
- Logs carry counts, sizes and ids, never addresses, usernames or subjects.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, AnyStr

import psycopg
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session, syntax

from mailroom.core import fastpaths
from mailroom.core.errors import describe_db_error
from mailroom.core.log import get_logger
from mailroom.inboxes.addresses import parse_path
from mailroom.inboxes.auth import Authenticator, Capture, LoginFailures
from mailroom.inboxes.delivery import REPLY_TEMPFAIL, Delivery
from mailroom.inboxes.metrics import RCPT_VERDICTS, InboundMetrics, InboundTally
from mailroom.inboxes.mime import clean_text

log = get_logger("inbox")

# InboundSMTP builds on aiosmtpd's internals: smtp_DATA is aiosmtpd 1.4.6's DATA handler with a reader
# bounded by the transaction's recipients (aiosmtpd's public hooks only see a message once it is all
# in memory), and it uses the members below. These are the versions it is tested with; pyproject.toml
# allows no newer minor release, tests/inboxes/test_aiosmtpd_pin.py fails on any version not listed
# here, and `inbox serve` warns at start on one.
AIOSMTPD_TESTED = ("1.4.6",)
AIOSMTPD_INTERNALS = ("_tls_protocol", "_reader", "_set_post_data_state", "_call_handler_hook", "_reset_timeout",
                      "_handler_coroutine", "_getaddr", "_create_session", "_create_envelope", "_authenticate",
                      "_auth_required")

# Replies of the protocol layer (a recipient's or a message's verdict comes with its reply from SQL).
# Addresses are never echoed back or logged.
REPLY_TOO_MANY = "452 4.5.3 Too many recipients"
REPLY_OVER_SIZE = "552 5.3.4 Message too big for this mailbox"  # over the server's SIZE (--max-message-size)
REPLY_TOO_MANY_BAD = "421 4.7.0 Too many invalid recipients, closing connection"
REPLY_BUSY = "421 4.3.2 Too many connections, try again later"
REPLY_BUSY_CLIENT = "421 4.7.0 Too many connections from your address, try again later"
REPLY_LINE_TOO_LONG = "500 Line too long (see RFC5321 4.5.3.1.6)"
REPLY_SEPARATE = "452 4.5.3 Bounces and mail for inboxes go in separate transactions"
REPLY_STARTTLS_FIRST = "530 5.7.0 Must issue a STARTTLS command first"
# aiosmtpd's own reply when require_starttls refuses a command (RFC 3207's text, without the enhanced
# status code mailroom's other replies carry): InboundSMTP.push answers REPLY_STARTTLS_FIRST instead
AIOSMTPD_STARTTLS_FIRST = "530 Must issue a STARTTLS command first"
REPLY_LOGINS_BLOCKED = "454 4.7.0 Too many failed logins from your address, try again later"
REPLY_AUTH_TEMPFAIL = "454 4.7.0 Temporary authentication failure, please try again later"


def _declared_size(mail_options: list[str]) -> int | None:
    for option in mail_options:
        key, _, value = option.partition("=")
        if key.upper() == "SIZE" and value.isdigit():
            return int(value)
    return None


# DATA asks whether the message still fits each time it grows this much past the largest size known
# to fit: a message never costs a query below it (or below a SIZE= every recipient accepted at RCPT), and
# is never held past its recipients' largest limit by more than this (plus the line being read).
_SIZE_PROBE_BYTES = 256 * 1024
# DATA is read this much at a time at most (InboundSMTP._read_data_bulk)
_DATA_READ_BYTES = 64 * 1024


class _Envelope(Envelope):
    """One transaction (a new one per MAIL, after DATA and at RSET)."""

    def __init__(self) -> None:
        super().__init__()
        self.accepted: list[str] = []  # SQL's normalized form of the accepted recipients, each once
        self.accepted_count = 0  # RCPTs answered 250 (a repeated address counts again)
        self.bounces: list[str] = []  # accepted VERP return paths (normalized), each once
        self.captured = False  # a logged-in session's: accepted is [the capture inbox]


class _Session(Session):
    """One connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        # unknown recipients in this session, whatever the transaction (a directory-harvest defence;
        # expired and deleted inboxes are the normal life of this service and do not count)
        self.refused_recipients = 0
        self.capture: Capture | None = None  # after a successful AUTH: where every message goes


@functools.cache
def _hook_members(cls: type) -> list[str]:
    """The members of `cls` that aiosmtpd's SMTP.__init__ looks up by name (smtp_* commands, auth_*
    mechanisms, handle_* hooks), found once per class.

    aiosmtpd 1.4.6 finds them at every connection with dir() and inspect.getmembers() on the new SMTP
    object and on the handler: getattr of every attribute of both (about 200), 17% of the server's CPU
    with a new session per message (cProfile, smtp-source without -d). The names are the classes'
    (nothing sets such an attribute on an instance), so InboundSMTP and InboxHandler answer dir()
    with this list and aiosmtpd builds the same tables from it (tests/inboxes/test_inbox_sessions.py)."""
    return [name for name in dir(cls) if name.startswith(("smtp_", "auth_", "handle_"))]


class InboxHandler:
    """aiosmtpd handler: RCPT checks and DATA delivery through the SQL API."""

    if fastpaths.enabled():  # MAILROOM_FAST_PATHS=off: aiosmtpd's dir() of every attribute, every connection
        def __dir__(self) -> list[str]:
            return _hook_members(type(self))  # what aiosmtpd looks for, at every connection: see _hook_members

    def __init__(self, delivery: Delivery, *, max_recipients: int = 100, metrics: InboundMetrics | None = None) -> None:
        self.delivery = delivery
        self.max_recipients = max_recipients
        self.metrics = metrics or InboundMetrics()
        # what the periodic summary line counts (delivery counts its statements in the same one)
        self.tally: InboundTally = delivery.tally if delivery is not None else InboundTally()
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def handle_RCPT(  # noqa: N802 - aiosmtpd hook name
        self, server: SMTP, session: _Session, envelope: _Envelope, address: str, rcpt_options: list[str]
    ) -> str:
        if envelope.accepted_count >= self.max_recipients:
            self.metrics.recipients.labels(verdict="too_many").inc()
            return REPLY_TOO_MANY
        address = clean_text(address) or ""
        capture = getattr(session, "capture", None)
        if capture is not None:  # logged in: any valid address (its syntax was read), stored in the capture inbox
            self.metrics.recipients.labels(verdict="captured").inc()
            envelope.accepted_count += 1
            envelope.captured = True
            if not envelope.accepted:
                envelope.accepted.append(capture.address)
            envelope.rcpt_tos.append(address)
            return "250 2.1.5 OK"
        try:
            verdict, normalized, refusal = await self.delivery.recipient(address, _declared_size(envelope.mail_options))
        except psycopg.OperationalError as exc:  # lost, or no answer within --db-timeout
            self.delivery.unreachable("recipient check", exc)
            self.metrics.recipients.labels(verdict="tempfail").inc()
            self.tally.tempfail += 1
            return REPLY_TEMPFAIL
        except psycopg.Error as exc:
            log.error("recipient check failed: %s", describe_db_error(exc))
            self.metrics.recipients.labels(verdict="tempfail").inc()
            self.tally.tempfail += 1
            return REPLY_TEMPFAIL
        except Exception as exc:  # noqa: BLE001 - a 4xx, never a traceback to the client
            log.error("recipient check failed unexpectedly: %s", type(exc).__name__)
            self.metrics.recipients.labels(verdict="tempfail").inc()
            self.tally.tempfail += 1
            return REPLY_TEMPFAIL
        self.delivery.reached()
        self.metrics.recipients.labels(verdict=verdict if verdict in RCPT_VERDICTS else "other").inc()
        if refusal is not None:
            if verdict == "unknown":  # the directory-harvest count (see _Session)
                session.refused_recipients += 1
            self.tally.refused_recipient(verdict)  # the summary line (--log-every)
            log.debug("refused a recipient at RCPT: %s", verdict)  # --log-messages
            return refusal
        if verdict == "bounce":
            if envelope.accepted:
                return REPLY_SEPARATE
            envelope.accepted_count += 1
            if normalized not in envelope.bounces:
                envelope.bounces.append(normalized)
                envelope.rcpt_tos.append(address)
            return "250 2.1.5 OK"
        if envelope.bounces:
            return REPLY_SEPARATE
        envelope.accepted_count += 1
        if normalized not in envelope.accepted:  # one stored copy per mailbox, however the address was written
            envelope.accepted.append(normalized)
            envelope.rcpt_tos.append(address)
            envelope.rcpt_options.extend(rcpt_options)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:  # noqa: N802
        """Deliver the message (or the bounce report) of the transaction: the reply."""
        self.in_flight += 1
        self.idle.clear()
        try:
            reply = await self._deliver(server, session, envelope)
        except Exception as exc:  # noqa: BLE001 - never a 250 without a stored row, never a traceback
            log.error("delivery failed unexpectedly: %s", type(exc).__name__)
            reply = REPLY_TEMPFAIL
        try:
            self.metrics.messages.labels(result=_result_of(reply)).inc()
            self.tally.answered(reply, bounce=isinstance(envelope, _Envelope) and bool(envelope.bounces))
            return reply
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()

    async def size_refusal(self, envelope: _Envelope, size: int) -> str | None:
        """None when some accepted recipient's plan takes a message of `size` octets, else the
        reply that refuses it (psycopg errors raise)."""
        return await self.delivery.size_refusal(envelope.accepted, size)

    async def _deliver(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content
        if raw is None:
            raw = envelope.content if isinstance(envelope.content, bytes) else b""
        raw = bytes(raw)
        if isinstance(envelope, _Envelope) and envelope.bounces:
            return await self.delivery.bounce(raw, list(envelope.bounces))
        mail_from = envelope.mail_from or ""
        if mail_from == "<>":
            mail_from = ""
        # a logged-in session's message goes once to the capture inbox, whatever its recipients
        recipients = envelope.accepted if isinstance(envelope, _Envelope) and envelope.captured else envelope.rcpt_tos
        return await self.delivery.message(raw, clean_text(mail_from) or "", list(recipients),
                                           _trace(server, session, envelope))


def _trace(server: SMTP, session: Session, envelope: Envelope) -> dict[str, Any]:
    """The SMTP session's facts SQL writes the stored message's Received: header from
    (sql/21_delivery.sql, _received_header: the format, the cleaning of the HELO name, for <…>)."""
    peer = session.peer
    return {
        "client": str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "",
        "helo": clean_text(session.host_name, 255) or "",  # the client's to choose: SQL keeps a domain's characters
        "by": server.hostname,
        "esmtp": session.extended_smtp,
        "tls": session.ssl is not None,
        "auth": bool(session.authenticated),
        "smtputf8": bool(getattr(envelope, "smtp_utf8", False)),
    }


def _result_of(reply: str) -> str:
    """The metric label of a DATA reply: stored (2xx), tempfail (4xx) or refused (5xx)."""
    return {"2": "stored", "4": "tempfail"}.get(reply[:1], "refused")


class _SessionGate:
    """Counts open SMTP sessions for --max-sessions, and per client address for
    --max-sessions-per-client (one event loop: no lock needed)."""

    def __init__(self, limit: int, metrics: InboundMetrics | None = None, per_client: int | None = None) -> None:
        self.limit = limit
        self.per_client = per_client
        self.open = 0
        self.clients: dict[str, int] = {}  # sessions open per client address
        self._refused = 0
        self._logged_at = float("-inf")
        self._refused_clients = 0
        self._clients_logged_at = float("-inf")
        self.metrics = metrics

    def enter_client(self, client: str) -> bool:
        """Take one of the client's sessions (after enter()), or False at its cap."""
        count = self.clients.get(client, 0)
        if self.per_client is None or count < self.per_client:
            self.clients[client] = count + 1
            return True
        if self.metrics is not None:
            self.metrics.sessions_refused.inc()
        self._refused_clients += 1
        now = time.monotonic()
        if now - self._clients_logged_at >= 10:  # one line per 10 s; never the address (personal data)
            log.warning("refused %d connection(s) of a client at its %d sessions (--max-sessions-per-client)",
                        self._refused_clients, self.per_client)
            self._refused_clients = 0
            self._clients_logged_at = now
        return False

    def leave_client(self, client: str) -> None:
        count = self.clients.get(client, 0) - 1
        if count > 0:
            self.clients[client] = count
        else:
            self.clients.pop(client, None)

    def enter(self) -> bool:
        if self.open < self.limit:
            self.open += 1
            if self.metrics is not None:
                self.metrics.sessions.inc()
                self.metrics.sessions_open.set(self.open)
            return True
        if self.metrics is not None:
            self.metrics.sessions_refused.inc()
        self._refused += 1
        now = time.monotonic()
        if now - self._logged_at >= 10:  # a flood of connections is one line per 10 s, not one each
            log.warning("refused %d connection(s): %d sessions open (--max-sessions)", self._refused, self.open)
            self._refused = 0
            self._logged_at = now
        return False

    def leave(self) -> None:
        self.open -= 1
        if self.metrics is not None:
            self.metrics.sessions_open.set(self.open)


class _Busy(asyncio.Protocol):
    """A connection over --max-sessions: 421 and hang up, before any database work."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(REPLY_BUSY.encode() + b"\r\n")  # type: ignore[attr-defined]
        transport.close()  # after the reply is flushed


class InboundSMTP(SMTP):
    """aiosmtpd's SMTP with the server's per-session limits and a DATA reader bounded by the
    transaction's recipients (aiosmtpd's own holds up to the server-wide data_size_limit)."""

    def __init__(self, handler: InboxHandler, *, max_bad_recipients: int = 10, gate: _SessionGate | None = None,
                 authenticator: Authenticator | None = None, login_failures: LoginFailures | None = None,
                 auth_required: bool = False, **kwargs: Any) -> None:
        # AUTH: aiosmtpd reads PLAIN and LOGIN; the check is `authenticator`'s (async, _check_login).
        # Without one every login is refused (535), as aiosmtpd's default does. auth_required is set
        # after aiosmtpd's __init__, which warns at every connection when AUTH is required without TLS
        # (a loopback listener, where that is meant: mailroom.inboxes.auth.auth_needs_tls).
        super().__init__(handler, **kwargs)
        self._auth_required = auth_required
        self._login = authenticator
        self._login_failures = login_failures
        self.max_bad_recipients = max_bad_recipients
        self._gate = gate  # its slot was taken by the factory, given back at connection_lost
        self._client: str | None = None  # the client address whose session this is (once counted)
        self._refused_client = False  # over the client's cap: answered 421 and closed, nothing else

    # DATA read in blocks (_read_data_bulk, on asyncio's StreamReader._buffer); False: line by line
    # (_read_data_lines), aiosmtpd's way, as with MAILROOM_FAST_PATHS=off
    bulk_data = fastpaths.enabled()

    if fastpaths.enabled():  # MAILROOM_FAST_PATHS=off: aiosmtpd's dir() of every attribute, every connection
        def __dir__(self) -> list[str]:
            return _hook_members(type(self))  # what aiosmtpd's __init__ looks for: see _hook_members

    def _create_session(self) -> _Session:
        return _Session(self.loop)

    async def push(self, status: AnyStr) -> None:
        if status == AIOSMTPD_STARTTLS_FIRST:
            status = REPLY_STARTTLS_FIRST  # type: ignore[assignment]
        await super().push(status)

    def _create_envelope(self) -> _Envelope:
        return _Envelope()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._gate is not None and self._client is None and not self._refused_client:
            # the first call (STARTTLS calls it again, for the same client): the client's cap
            peer = transport.get_extra_info("peername")
            client = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else ""
            if not self._gate.enter_client(client):
                self._gate.leave()
                self._gate = None
                self._refused_client = True
                transport.write(REPLY_BUSY_CLIENT.encode() + b"\r\n")  # type: ignore[attr-defined]
                transport.close()  # after the reply is flushed; no session, no database work
                return
            self._client = client
            self.event_handler.tally.sessions += 1
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        if self._refused_client:
            return  # no session was started
        if self._gate is not None:
            self._gate.leave()
            if self._client is not None:
                self._gate.leave_client(self._client)
            self._gate = None
        super().connection_lost(error)

    async def _hang_up(self, reply: str) -> None:
        """421 and close, like QUIT: commands the client pipelined after it are not run."""
        await self.push(reply)
        if self.transport is not None:
            self.transport.close()  # after the reply is flushed
        if self._handler_coroutine is not None:
            self._handler_coroutine.cancel()  # this very task: it ends at the next await
        await asyncio.sleep(0)  # here, before a pipelined command is read

    def _peer_address(self) -> str:
        peer = self.session.peer if self.session is not None else None
        return str(peer[0]) if isinstance(peer, (tuple, list)) and peer else ""

    @syntax("AUTH <mechanism>")
    async def smtp_AUTH(self, arg: str) -> None:  # noqa: N802 - aiosmtpd command name
        """aiosmtpd's AUTH, after the client's failed logins are counted: at the limit, 454 at once."""
        if self._login_failures is not None and self._login_failures.blocked(self._peer_address()):
            await self.push(REPLY_LOGINS_BLOCKED)
            return
        await super().smtp_AUTH(arg)

    def _authenticate(self, mechanism: str, auth_data: Any) -> AuthResult:
        """aiosmtpd's auth_PLAIN/auth_LOGIN call this once they have read a username and password: here it
        only hands them on (it cannot wait for the database); auth_PLAIN/auth_LOGIN below check them."""
        return AuthResult(success=True, auth_data=auth_data)

    async def auth_PLAIN(self, server: SMTP, args: list[str]) -> AuthResult:  # noqa: N802 - aiosmtpd mechanism name
        return await self._check_login(await super().auth_PLAIN(server, args))

    async def auth_LOGIN(self, server: SMTP, args: list[str]) -> AuthResult:  # noqa: N802 - aiosmtpd mechanism name
        return await self._check_login(await super().auth_LOGIN(server, args))

    async def _check_login(self, read: AuthResult) -> AuthResult:
        """The login read by aiosmtpd, checked by the authenticator: success gives the session its
        Capture; a refusal is its reply (535 counted as a failure of the client address)."""
        if not read.success or not isinstance(read.auth_data, LoginPassword):
            return read  # refused while reading (aiosmtpd sent its reply, or answers 535)
        if self._login is None:
            return AuthResult(success=False, handled=False)  # 535
        handler: InboxHandler = self.event_handler
        username = read.auth_data.login.decode("utf-8", "replace")
        try:
            outcome = await self._login.login(username, read.auth_data.password)
        except psycopg.OperationalError as exc:
            handler.delivery.unreachable("login", exc)
            return AuthResult(success=False, handled=False, message=REPLY_AUTH_TEMPFAIL)
        except Exception as exc:  # noqa: BLE001 - a 4xx, never a traceback to the client
            log.error("login failed unexpectedly: %s", describe_db_error(exc) if isinstance(exc, psycopg.Error)
                      else type(exc).__name__)
            return AuthResult(success=False, handled=False, message=REPLY_AUTH_TEMPFAIL)
        if isinstance(outcome, str):
            if outcome.startswith("535") and self._login_failures is not None:
                self._login_failures.failed(self._peer_address())
            log.info("refused a login: %s", outcome[:9])  # never the username
            return AuthResult(success=False, handled=False, message=outcome)
        if outcome is None:  # the sink's accept-any: logged in, no capture (stored by recipient)
            return AuthResult(success=True, auth_data=None)
        handler.delivery.reached()
        self.session.capture = outcome  # type: ignore[union-attr]
        return AuthResult(success=True, auth_data=outcome)

    def _getaddr(self, arg: str) -> tuple[str | None, str | None]:
        """The path of MAIL FROM / RCPT TO read in time linear in its length (mailroom.inboxes.addresses):
        aiosmtpd's own reading (email's header parser) is quadratic on quotes, dots and backslashes
        and costs ~40 us a call on the simplest path; the answers agree (tests/inboxes/test_inbox_fastpaths.py)."""
        return parse_path(arg, self.local_part_limit)

    async def smtp_RCPT(self, arg: str | None) -> None:  # noqa: N802 - aiosmtpd command name
        assert self.session is not None
        if self.session.refused_recipients >= self.max_bad_recipients:  # type: ignore[attr-defined]
            log.warning("closing a session after %d refused recipient(s)",
                        self.session.refused_recipients)  # type: ignore[attr-defined]
            await self._hang_up(REPLY_TOO_MANY_BAD)
            return
        await super().smtp_RCPT(arg)

    async def _take(self, data: _DataRead, line: bytes | bytearray, envelope: _Envelope, handler: InboxHandler,
                    cap: int | None) -> None:
        """One line (or piece of a too long line) of DATA, dot-stuffing removed: the size checks,
        then kept, or dropped once the message is refused."""
        data.received += len(line)
        if data.refusal is None and cap is not None and data.received > cap:
            data.refusal, data.too_big_for = REPLY_OVER_SIZE, "the server's SIZE"
        elif data.refusal is None and not envelope.bounces and data.received > data.fits + _SIZE_PROBE_BYTES:
            try:
                too_big = await handler.size_refusal(envelope, data.received)
                if too_big is None:
                    data.fits = data.received
                else:
                    data.refusal, data.too_big_for = too_big, "its recipients' size limit"
            except psycopg.OperationalError as exc:
                handler.delivery.unreachable("size check", exc)
                data.refusal = REPLY_TEMPFAIL  # delivery could not succeed either: hold nothing more
            except psycopg.Error as exc:
                log.error("size check failed: %s", describe_db_error(exc))
                data.refusal = REPLY_TEMPFAIL  # delivery could not succeed either: hold nothing more
            except Exception as exc:  # noqa: BLE001 - a 4xx after the data, never a 500 in the middle of it
                log.error("size check failed unexpectedly: %s", type(exc).__name__)
                data.refusal = REPLY_TEMPFAIL
        if data.refusal is None:
            data.body += line
        elif data.body:
            data.held = max(data.held, len(data.body))
            data.body = bytearray()

    async def _read_data_lines(self, data: _DataRead, envelope: _Envelope, handler: InboxHandler,
                               cap: int | None) -> None:
        """DATA line by line (aiosmtpd's way: readuntil CRLF, bounded by the line length limit)."""
        line_start = True
        while True:
            try:
                line = await self._reader.readuntil(b"\r\n")
            except asyncio.LimitOverrunError as exc:
                # Longer than the line limit: take the part read so far (never a lone CR of CRLF).
                data.refusal = data.refusal or REPLY_LINE_TOO_LONG
                line = await self._reader.read(exc.consumed)
            if line_start and line == b".\r\n":
                break
            if line_start and line.startswith(b"."):
                line = line[1:]
            line_start = line.endswith(b"\r\n")
            await self._take(data, line, envelope, handler, cap)

    async def _read_data_bulk(self, data: _DataRead, envelope: _Envelope, handler: InboxHandler,
                              cap: int | None) -> None:
        """DATA in blocks: what _read_data_lines gives, without a coroutine and a buffer copy per line.

        The end is the first ".\r\n" at the start or after a CRLF (a piece of a too long line never
        ends in CRLF, so lines are CRLF-terminated whatever the reads). Each read's complete lines
        are taken at once when no line passes the limit and no size check can fire within them
        (the size only grows), else line by line through _take, in the order _read_data_lines
        takes them. An unfinished line longer than the limit is refused and dropped at once (its
        last byte kept when it is a CR), so at most a read plus a line is held beyond the message.
        Bytes read past the end (a pipelined command) go back to the front of the reader's buffer.
        """
        reader = self._reader
        limit = self.line_length_limit  # the reader's limit: a line of more octets is too long
        pending = bytearray()  # read, not yet taken; starts at a line start unless in_long_line
        in_long_line = False  # pending continues a too long line whose start was taken
        while True:
            chunk = await reader.read(_DATA_READ_BYTES)
            if not chunk:  # readuntil's answer to an EOF (eof_received normally cancels first)
                raise asyncio.IncompleteReadError(bytes(pending), None)
            pending += chunk
            if in_long_line:
                end = pending.find(b"\r\n")
                if end == -1:
                    keep = 1 if pending.endswith(b"\r") else 0  # maybe the CR of the CRLF
                    await self._take(data, bytes(pending[:len(pending) - keep]), envelope, handler, cap)
                    del pending[:len(pending) - keep]
                    continue
                await self._take(data, bytes(pending[:end + 2]), envelope, handler, cap)
                del pending[:end + 2]
                in_long_line = False
            if pending.startswith(b".\r\n"):
                end = 0
            else:
                end = pending.find(b"\r\n.\r\n")
                end = -1 if end == -1 else end + 2
            if end != -1:
                await self._take_lines(data, bytes(pending[:end]), limit, envelope, handler, cap)
                rest = pending[end + 3:]
                if rest:  # read past the end: back in front of what the reader holds, for the command loop
                    reader._buffer[:0] = rest  # type: ignore[attr-defined]
                return
            last = pending.rfind(b"\r\n")
            if last != -1:
                await self._take_lines(data, bytes(pending[:last + 2]), limit, envelope, handler, cap)
                del pending[:last + 2]
            keep = 1 if pending.endswith(b"\r") else 0
            if len(pending) - keep > limit:  # an unfinished line already too long: refused, dropped
                data.refusal = data.refusal or REPLY_LINE_TOO_LONG
                piece = bytes(pending[:len(pending) - keep])
                await self._take(data, piece[1:] if piece.startswith(b".") else piece, envelope, handler, cap)
                del pending[:len(pending) - keep]
                in_long_line = True

    async def _take_lines(self, data: _DataRead, lines: bytes, limit: int, envelope: _Envelope,
                          handler: InboxHandler, cap: int | None) -> None:
        """Complete lines (CRLF-terminated, the first at a line start), as _read_data_lines takes them."""
        if not lines:
            return
        if len(lines) <= limit + 2:
            longest = len(lines) - 2
        else:
            longest = max(map(len, lines.split(b"\r\n")))
        if longest <= limit:
            text = lines.replace(b"\r\n.", b"\r\n")
            if text.startswith(b"."):
                text = text[1:]
            size = data.received + len(text)
            if data.refusal is not None:  # counted for the log only
                data.received = size
                return
            if (cap is None or size <= cap) and (envelope.bounces or size <= data.fits + _SIZE_PROBE_BYTES):
                data.received = size  # no check fires in these lines
                data.body += text
                return
        start = 0
        while start < len(lines):
            end = lines.index(b"\r\n", start) + 2
            line = lines[start:end]
            start = end
            if len(line) - 2 > limit:
                data.refusal = data.refusal or REPLY_LINE_TOO_LONG
            await self._take(data, line[1:] if line.startswith(b".") else line, envelope, handler, cap)

    async def smtp_DATA(self, arg: str) -> None:  # noqa: N802 - aiosmtpd command name
        """aiosmtpd 1.4.6's DATA (decode_data=False) with the transaction's size limit.

        The message is kept in one buffer, dot-stuffing removed, so its size is the size
        deliver_message checks. Past the server's SIZE, or past what any accepted recipient's plan
        takes (asked every _SIZE_PROBE_BYTES), the buffer is dropped and the rest is read and thrown
        away up to the final dot; then 552 5.3.4, and the session goes on. It is read in blocks
        (_read_data_bulk), or line by line like aiosmtpd (_read_data_lines, when bulk_data is
        False): the same bytes, the same reply.
        """
        if await self.check_helo_needed():
            return
        if await self.check_auth_needed("DATA"):
            return
        envelope = self.envelope
        assert isinstance(envelope, _Envelope)
        if not envelope.rcpt_tos:
            await self.push("503 Error: need RCPT command")
            return
        if arg:
            await self.push("501 Syntax: DATA")
            return
        handler: InboxHandler = self.event_handler
        cap = self.data_size_limit or None
        await self.push("354 End data with <CR><LF>.<CR><LF>")
        data = _DataRead(fits=_declared_size(envelope.mail_options) or 0)  # every recipient took this SIZE= at RCPT
        # the block reader gives back what it read past the end through the StreamReader's buffer
        if self.bulk_data and isinstance(getattr(self._reader, "_buffer", None), bytearray):
            await self._read_data_bulk(data, envelope, handler, cap)
        else:
            await self._read_data_lines(data, envelope, handler, cap)
        body, refusal, too_big_for, received = data.body, data.refusal, data.too_big_for, data.received
        held = max(data.held, len(body))
        if refusal is not None:
            if too_big_for:
                log.info("refused a message at DATA: over %s (read %d bytes, held at most %d)",
                         too_big_for, received, held)
            handler.tally.answered(refusal, bounce=bool(envelope.bounces))
            self._set_post_data_state()
            await self.push(refusal)
            return
        envelope.original_content = bytes(body)
        envelope.content = envelope.original_content
        del body
        # The idle timer runs from the DATA command (it bounds the transfer); delivery gets a full
        # period of its own, so a slow COMMIT is not cut off before its 250.
        self._reset_timeout()
        status = await self._call_handler_hook("DATA")
        self._set_post_data_state()
        await self.push("250 OK" if not isinstance(status, str) else status)


class _DataRead:
    """What DATA has read so far: the message (dot-stuffing removed), its size and the verdict."""

    __slots__ = ("body", "received", "held", "refusal", "too_big_for", "fits")

    def __init__(self, fits: int) -> None:
        self.body = bytearray()
        self.received = 0  # octets of the message so far, dot-stuffing removed, CRLFs counted
        self.held = 0  # the most the buffer ever held
        self.refusal: str | None = None
        self.too_big_for = ""  # whose limit a refused message passed, for the log
        self.fits = fits  # the largest size known to fit (SIZE= or the last probe)


def _smtp_class(max_line_length: int) -> type[InboundSMTP]:
    """InboundSMTP with our line length limit (the StreamReader limit is read from the class)."""
    return type("InboundSMTP", (InboundSMTP,), {"line_length_limit": max_line_length + 1})


