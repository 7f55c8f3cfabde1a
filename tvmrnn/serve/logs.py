"""Structured logs: one JSON object per line on stderr, for our records and uvicorn's alike.

Log with `log.info("event", extra={"fields": {...}})`; the fields become keys of the line.
"""

from __future__ import annotations

import datetime
import json
import logging


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds"),
                "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        line.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def logging_config(level: str = "info") -> dict:
    """A logging.config.dictConfig for tvmrnn.serve and uvicorn (also given to uvicorn as its log_config)."""
    level = level.upper()
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"json": handler},
        "loggers": {
            "tvmrnn": {"handlers": ["json"], "level": level, "propagate": False},
            "uvicorn": {"handlers": ["json"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": ["json"], "level": "WARNING", "propagate": False},
        },
    }
