"""Structured logs: one JSON object per line in production (python-json-logger), a readable
line in development and tests (`default_format`, by AIJOBS_ENV).

Records carry ids only. A line logged while a job is being worked on carries `job_id`,
`job_type` and `workflow_id` (set by the job activities and the API, `engine/logcontext.py`) and,
when tracing is on, the `trace_id` and `span_id` of the current span, so a log line leads to
its trace and its Temporal execution. Job input, prompts, model output and keys are never passed
to a logger anywhere in the engine; the filter adds ids, never values.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any, Literal

from opentelemetry import trace
from pythonjsonlogger.json import JsonFormatter as _PythonJsonFormatter
from temporalio.exceptions import ApplicationError

from engine.errors import PUBLIC_MESSAGES
from engine.logcontext import current_job

_STD = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}
# Extras the SDK adds that repeat what the job context says (and can be long).
_SDK_EXTRAS = frozenset({"temporal_activity", "temporal_workflow", "color_message"})
CONTEXT_FIELDS = ("job_id", "job_type", "workflow_id", "trace_id", "span_id")
LogFormat = Literal["json", "text"]


class JobContextFilter(logging.Filter):
    """Copies the current job's ids and the current trace onto every record it sees (without
    overwriting what the call site passed in `extra=`). Attached to the handlers, so records of
    every logger (ours, the SDK's, libraries') get them."""

    def filter(self, record: logging.LogRecord) -> bool:
        job = current_job()
        if job is not None:
            _set_default(record, "job_id", job.job_id)
            if job.job_type:
                _set_default(record, "job_type", job.job_type)
            if job.workflow_id:
                _set_default(record, "workflow_id", job.workflow_id)
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            _set_default(record, "trace_id", format(ctx.trace_id, "032x"))
            _set_default(record, "span_id", format(ctx.span_id, "016x"))
        return True


# Classified outcomes a job may meet in normal operation. INTERNAL_* codes stand for unexpected
# exceptions, whose traceback is what an operator needs, so they are not in this set.
EXPECTED_CODES = frozenset(c for c in PUBLIC_MESSAGES if not c.startswith("INTERNAL_"))


class ExpectedFailureFilter(logging.Filter):
    """The SDK's "Completing activity as failed" record for an expected failure (an
    ApplicationError whose type is a classified, non-internal error code) becomes one line
    carrying `error_code`, without the traceback: a provider outage or a content-safety refusal
    is an outcome, not a bug, and a traceback per attempt buries the real ones. Any other
    exception keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "temporalio.activity" or not isinstance(record.exc_info, tuple):
            return True
        exc = record.exc_info[1]
        if isinstance(exc, ApplicationError) and exc.type in EXPECTED_CODES:
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
            record.error_code = exc.type
            record.msg = f"{record.msg} ({exc.type})"
        return True


def _set_default(record: logging.LogRecord, name: str, value: str) -> None:
    if getattr(record, name, None) is None:
        setattr(record, name, value)


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {
        k: v
        for k, v in record.__dict__.items()
        if k not in _STD and k not in _SDK_EXTRAS and not k.startswith("_")
    }


class JsonFormatter(_PythonJsonFormatter):
    """`{"ts", "level", "logger", "msg", "component", ...ids and extras}` per line. Values that
    are not JSON types are written as their `str()`."""

    def __init__(self, component: str = "aijobs") -> None:
        super().__init__(
            ["levelname", "name", "message"],
            rename_fields={"levelname": "level", "name": "logger", "message": "msg"},
            static_fields={"component": component},
            reserved_attrs=[*_STD, *_SDK_EXTRAS],
            timestamp="ts",
            json_ensure_ascii=False,
        )

    def add_fields(
        self,
        log_data: dict[str, Any],
        record: logging.LogRecord,
        message_dict: dict[str, Any],
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        log_data["level"] = record.levelname.lower()
        log_data["ts"] = datetime.fromtimestamp(record.created, UTC).isoformat(
            timespec="milliseconds"
        )


class TextFormatter(logging.Formatter):
    """`HH:MM:SS.mmm LEVEL logger: message  key=value ...` for a person at a terminal."""

    def __init__(self, component: str = "aijobs") -> None:
        super().__init__(
            "%(asctime)s.%(msecs)03d %(levelname)-5s %(name)s: %(message)s", "%H:%M:%S"
        )
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if not extras:
            return line
        head, sep, tail = line.partition("\n")  # a traceback stays below the fields
        fields = " ".join(f"{k}={_short(v)}" for k, v in extras.items())
        return f"{head}  {fields}{sep}{tail}"


def _short(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def build_handler(
    stream: IO[str] | None = None, *, log_format: LogFormat = "json", component: str = "aijobs"
) -> logging.Handler:
    """A handler with the process's formatter and the job-context filter (tests reuse it)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    formatter: logging.Formatter = (
        JsonFormatter(component) if log_format == "json" else TextFormatter(component)
    )
    handler.setFormatter(formatter)
    handler.addFilter(JobContextFilter())
    handler.addFilter(ExpectedFailureFilter())
    return handler


def default_format(environment: str) -> LogFormat:
    """JSON lines for a deployment's log pipeline; readable lines for a person at a terminal."""
    return "json" if environment == "production" else "text"


def setup_logging(
    level: str = "INFO", *, process: str = "aijobs", log_format: LogFormat = "json"
) -> None:
    handler = build_handler(log_format=log_format, component=process)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "httpx", "temporalio.activity", "temporalio.workflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("aijobs").info("logging ready", extra={"component": process})
