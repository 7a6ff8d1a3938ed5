"""Regenerate driver/mailroom/checks/data/ from the npm package `caniemail` (`make caniemail`).

The HTML check (mailroom.checks.html, docs/checks.md) reads caniemail.com's support data as it ships
inside the package; it is never fetched at run time. This script fetches the package with the
ordinary npm client (`npm pack caniemail@VERSION` in a temporary directory), checks that its licence
is still MIT, and writes:

- caniemail.json: each feature (slug, title, category, url, notes) with, for each client (family and
  platform), the support of its latest tested version (y, a, n, u and its note numbers);
- LICENSE.caniemail: the package's licence and the upstream data's (both MIT), and where they came from.

Usage: python scripts/refresh_caniemail.py [--version 2.0.2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "driver" / "mailroom" / "checks" / "data"
UPSTREAM_NOTICE = """\
The support data itself is caniemail.com's (https://github.com/hteumeuleu/caniemail), under this licence:

MIT License

Copyright (c) 2019 HTeuMeuLeu

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""


def latest(versions: dict[str, str]) -> str:
    # caniemail lists a client's tested versions oldest first: the last one is what it does today
    return list(versions.values())[-1] if versions else "u"


def trim(doc: dict, version: str) -> dict:
    features = []
    for entry in doc["data"]:
        support = {f"{family}.{platform}": latest(versions)
                   for family, platforms in (entry.get("stats") or {}).items()
                   for platform, versions in platforms.items()}
        features.append({
            "slug": entry["slug"], "title": entry["title"], "category": entry["category"], "url": entry["url"],
            "notes": entry.get("notes"), "notes_by_num": entry.get("notes_by_num") or {}, "support": support,
        })
    return {"source": f"caniemail {version}", "api_version": doc.get("api_version"),
            "last_update_date": doc.get("last_update_date"), "nicenames": doc.get("nicenames"), "features": features}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="2.0.2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(["npm", "pack", f"caniemail@{args.version}", "--silent"], cwd=tmp, capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[-1]
        with tarfile.open(Path(tmp) / out) as tar:
            tar.extractall(tmp, filter="data")
        package = Path(tmp) / "package"
        meta = json.loads((package / "package.json").read_text())
        licence = (package / "LICENSE").read_text()
        if meta.get("license") != "MIT" or not licence.startswith("MIT License"):
            print(f"caniemail {args.version}: licence {meta.get('license')!r} is no longer MIT: not shipped", file=sys.stderr)
            return 1
        doc = json.loads((package / "data" / "caniemail.json").read_text())
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "caniemail.json").write_text(json.dumps(trim(doc, meta["version"]), sort_keys=True, separators=(",", ":")) + "\n")
    (DATA / "LICENSE.caniemail").write_text(
        f"driver/mailroom/checks/data/caniemail.json is derived from the npm package caniemail {meta['version']}\n"
        f"(https://github.com/shellscape/caniemail), whose licence follows:\n\n{licence.rstrip()}\n\n{UPSTREAM_NOTICE}")
    print(f"caniemail {meta['version']}: {len(doc['data'])} features written to {DATA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
