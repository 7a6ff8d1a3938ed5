"""Load a module of tests/outbound by its path, so the aliases run its test bodies unchanged."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

OUTBOUND = Path(__file__).resolve().parents[1] / "outbound"


def suite(name: str) -> ModuleType:
    """tests/outbound/<name>.py: the module pytest imported (same file), or loaded once here."""
    path = OUTBOUND / f"{name}.py"
    for key in (name, f"outbound_suite_{name}"):
        loaded = sys.modules.get(key)
        if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
    spec = importlib.util.spec_from_file_location(f"outbound_suite_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
