"""The seed article's C collector (collector.c), built at bench time as the reference peer of
`mailroom collect`: see the header of collector.c for what it does and where it departs from the
original repository."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "collector.c"


class Unavailable(Exception):
    """The reference cannot be built here (no compiler, no libpq or OpenSSL headers)."""


def _include_dirs() -> list[str]:
    dirs = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--includedir"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            dirs.append(out.stdout.strip())
    dirs.append("/usr/include/postgresql")
    return [d for d in dict.fromkeys(dirs) if Path(d, "libpq-fe.h").exists()]


def build(into: Path) -> Path:
    """`cc -O2` collector.c into `into`; the executable's path, or Unavailable with the reason."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise Unavailable("no C compiler (cc) on PATH")
    includes = _include_dirs()
    if not includes:
        raise Unavailable("libpq-fe.h not found (install libpq-dev)")
    exe = into / "seed-collector"
    argv = [cc, "-O2", *(f"-I{d}" for d in includes), str(SOURCE), "-o", str(exe), "-lpq", "-lcrypto"]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise Unavailable(f"cc failed (libpq / OpenSSL headers or libraries missing?): {out.stderr.strip()[-200:]}")
    return exe
