"""Helpers of the checks' tests."""

from __future__ import annotations

from typing import Any


def assert_shape(doc: dict, model: Any) -> None:
    """The answer has exactly its model's keys (mailroom.http.models) and validates against it."""
    assert set(doc) == {f.alias or name for name, f in model.model_fields.items()}, (set(doc), model.__name__)
    model.model_validate(doc)
