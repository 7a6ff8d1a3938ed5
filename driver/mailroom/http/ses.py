"""POST /hooks/ses: SES receipts delivered by SNS (the SNS action of an SES receipt rule).

The SNS message is verified (mailroom.http.sns), a SubscriptionConfirmation is confirmed, and a
Notification of type Received carries the raw message in `content` (encoding UTF8 or BASE64, as the
SNS action is set). It is parsed by the SMTP server's parser (mailroom.inboxes.mime.parse_message;
when large, in the HTTP server's parsing processes, mailroom.inboxes.parsing) and stored for
`receipt.recipients` by ONE call of deliver_ses_message (sql/29_ses.sql), which
checks each recipient as RCPT does (catch-all included) and stores through deliver_message's guard:
an expired inbox, the size and the count limits answer exactly as over SMTP. A replay of an SES
messageId stores nothing.

Answers: 200 once handled, whatever each recipient's outcome (SNS retries only 5xx; a refused
recipient would be refused again); 403 for a message that fails verification; 400 for one that is
not an SES receipt; 503 when the database is unavailable (SNS retries, for up to an hour). Mail
over 150 KB does not fit in an SNS notification: SES's S3 action is not supported (docs/http.md).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections import Counter
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from psycopg.types.json import Jsonb

from mailroom.core.log import get_logger
from mailroom.http import sqlapi
from mailroom.http.sns import SnsError
from mailroom.http.state import ApiError, State
from mailroom.inboxes.mime import clean_text

log = get_logger("http")


def _bad(message: str) -> ApiError:
    return ApiError(400, "22023", message)


def _raw_content(receipt: dict[str, Any]) -> bytes:
    content = receipt.get("content")
    if not isinstance(content, str):
        raise _bad("the notification carries no content: only SES's SNS action is supported (not S3)")
    action = (receipt.get("receipt") or {}).get("action") or {}
    if str(action.get("encoding", "UTF8")).upper() == "BASE64":
        try:
            return base64.b64decode(content, validate=False)
        except (binascii.Error, ValueError):
            raise _bad("content is not base64") from None
    return content.encode("utf-8", "surrogateescape")


async def handle(state: State, request: Request, body: bytes) -> Response:
    assert state.sns is not None
    try:
        message = json.loads(body)
    except ValueError:
        raise _bad("the body is not an SNS message (JSON)") from None
    if not isinstance(message, dict):
        raise _bad("the body is not an SNS message (JSON object)")
    try:
        await asyncio.to_thread(state.sns.verify, message)
    except SnsError as exc:
        log.warning("ses: refused an SNS message: %s", exc)
        raise ApiError(403, "", f"SNS message not trusted: {exc}", kind="denied") from None

    kind = message.get("Type")
    if kind == "SubscriptionConfirmation":
        try:
            await asyncio.to_thread(state.sns.confirm, message)
        except SnsError as exc:
            log.error("ses: could not confirm the subscription: %s", exc)
            raise ApiError(503, "", f"could not confirm the subscription: {exc}", kind="unavailable") from None
        log.info("ses: subscription confirmed")
        return JSONResponse({"confirmed": True})
    if kind == "UnsubscribeConfirmation":
        log.warning("ses: the topic unsubscribed this endpoint")
        return JSONResponse({"unsubscribed": True})

    try:
        receipt = json.loads(message.get("Message") or "")
    except ValueError:
        raise _bad("the notification's Message is not JSON") from None
    if not isinstance(receipt, dict) or receipt.get("notificationType") != "Received":
        log.info("ses: ignored a notification that is not a receipt")
        return JSONResponse({"ignored": True})
    mail = receipt.get("mail") or {}
    recipients = (receipt.get("receipt") or {}).get("recipients") or mail.get("destination") or []
    ses_id = mail.get("messageId")
    if not isinstance(ses_id, str) or not isinstance(recipients, list) or not all(isinstance(r, str) for r in recipients):
        raise _bad("the receipt has no messageId or recipients")
    raw = _raw_content(receipt)
    parsed = await state.parser.message(raw)  # inline when small, else in a parsing process
    source = mail.get("source")
    rows = await state.call(
        sqlapi.deliver_ses_message, shape="rows", retry=False,
        ses_message_id=ses_id, recipients=[clean_text(r) or "" for r in recipients[:100]], raw=raw,
        envelope_from=clean_text(source) if isinstance(source, str) else "", parsed=Jsonb(parsed.document()),
    )
    outcomes = Counter(r.outcome for r in rows)
    stored = outcomes.pop("stored", 0)
    if outcomes.get("duplicate"):
        log.info("ses: a replayed receipt stored nothing")
        return JSONResponse({"stored": 0, "duplicate": True})
    ids = [r.message_id for r in rows if r.message_id is not None]
    log.info("ses: stored %d of %d recipient(s)%s, ids %s", stored, len(rows),
             "".join(f", {n} {o}" for o, n in sorted(outcomes.items())), ",".join(map(str, ids)))
    return JSONResponse({"stored": stored, "refused": dict(outcomes), "duplicate": False})
