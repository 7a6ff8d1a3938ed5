"""stderr logging in the collector's readable format: `YYYY/MM/DD HH:MM:SS [component] message`."""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s [%(name)s] %(message)s"
_DATEFMT = "%Y/%m/%d %H:%M:%S"


def get_logger(component: str) -> logging.Logger:
    """A logger writing to stderr, named after the component (`collect`, `send`, `inbox`)."""
    logger = logging.getLogger(component)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, _DATEFMT))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger
