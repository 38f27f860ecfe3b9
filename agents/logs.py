"""Worker logging: plain text for people, one JSON object per line for machines
(``LIGHTBOX_LOG_FORMAT=json``), with the current trace and span ids when a span is active.

Extra fields given as ``log.info("...", extra={"code": "DECODE_FAILED"})`` land in the JSON
object. Messages never carry payload bytes: callers pass codes, sizes and ids.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Literal

__all__ = ["JsonFormatter", "logging_config"]

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def _trace_ids() -> dict[str, str]:
    try:
        from opentelemetry import trace
    except ImportError:  # opentelemetry-api is a dependency; this only guards odd installs
        return {}
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return {}
    return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", trace_id?, span_id?, exc?, ...extra}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_trace_ids())
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if isinstance(value, str | int | float | bool | type(None)) else repr(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def logging_config(fmt: Literal["text", "json"], level: str = "WARNING") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` dictionary (Faust's Worker takes it as ``logging_config``)."""
    formatter: dict[str, Any] = ({"()": f"{__name__}.JsonFormatter"} if fmt == "json" else
                                 {"format": "[%(asctime)s] %(levelname)s %(name)s: %(message)s"})
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"lightbox": formatter},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "lightbox", "stream": "ext://sys.stderr"}},
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {"aiokafka": {"level": "ERROR"}},
    }
