"""inbox serve builds on aiosmtpd's internals (InboundSMTP.smtp_DATA, _getaddr, _hang_up): it runs only
with the aiosmtpd versions it is tested with, and says so when another one is installed."""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import aiosmtpd
from aiosmtpd.smtp import SMTP

from mailroom.inboxes.smtp import AIOSMTPD_INTERNALS, AIOSMTPD_TESTED

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_aiosmtpd_is_a_tested_version() -> None:
    assert aiosmtpd.__version__ in AIOSMTPD_TESTED, (
        f"aiosmtpd {aiosmtpd.__version__} is not tested with InboundSMTP (tested: {AIOSMTPD_TESTED}): check smtp_DATA "
        "against its DATA handler and the members in AIOSMTPD_INTERNALS, then add the version"
    )


def test_the_internals_it_uses_exist() -> None:
    source = inspect.getsource(SMTP)
    missing = [name for name in AIOSMTPD_INTERNALS if not hasattr(SMTP, name) and f"self.{name} =" not in source]
    assert missing == [], f"aiosmtpd {aiosmtpd.__version__} lacks {missing}"


def test_pyproject_allows_no_untested_minor_release() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("aiosmtpd"))
    upper = re.search(r"<\s*([0-9.]+)", spec)
    assert upper, f"aiosmtpd has no upper bound in pyproject.toml: {spec!r}"
    bound = tuple(int(x) for x in upper.group(1).split("."))
    for version in AIOSMTPD_TESTED:
        assert tuple(int(x) for x in version.split(".")) < bound
    newest = max(tuple(int(x) for x in v.split(".")) for v in AIOSMTPD_TESTED)
    assert bound <= (newest[0], newest[1] + 1), f"{spec!r} allows minor releases newer than the tested {newest}"


def test_the_starttls_refusal_it_rewrites_is_aiosmtpd_s() -> None:
    # InboundSMTP.push answers 530 5.7.0 in place of this exact reply of aiosmtpd's require_starttls
    from mailroom.inboxes.smtp import AIOSMTPD_STARTTLS_FIRST

    assert f"'{AIOSMTPD_STARTTLS_FIRST}'" in inspect.getsource(SMTP._handle_client)
