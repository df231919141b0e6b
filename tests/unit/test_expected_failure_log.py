"""An expected job failure (a classified error code raised as ApplicationError) is logged by the
Temporal SDK as one line with its code and no traceback; an unexpected one keeps its traceback."""

from __future__ import annotations

import io
import logging
import sys

from temporalio.exceptions import ApplicationError

from runtime.logs import ExpectedFailureFilter, build_handler


def _record(exc: BaseException, name: str = "temporalio.activity") -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        info = sys.exc_info()
    return logging.LogRecord(
        name, logging.WARNING, __file__, 1, "Completing activity as failed", None, info
    )


def _formatted(record: logging.LogRecord) -> str:
    out = io.StringIO()
    handler = build_handler(out, log_format="text")
    handler.handle(record)
    return out.getvalue()


def test_a_classified_code_is_one_line_with_its_code() -> None:
    record = _record(ApplicationError("unavailable", type="PROVIDER_UNAVAILABLE"))
    assert ExpectedFailureFilter().filter(record)
    assert record.exc_info is None
    assert record.__dict__["error_code"] == "PROVIDER_UNAVAILABLE"
    line = _formatted(_record(ApplicationError("blocked", type="CONTENT_SAFETY_BLOCKED")))
    assert line.count("\n") == 1, line
    assert "Traceback" not in line
    assert "CONTENT_SAFETY_BLOCKED" in line


def test_unexpected_errors_keep_their_traceback() -> None:
    for exc in (
        ValueError("boom"),
        ApplicationError("internal", type="INTERNAL_ERROR"),
        ApplicationError("what", type="SOMETHING_ELSE"),
    ):
        record = _record(exc)
        assert ExpectedFailureFilter().filter(record)
        assert record.exc_info is not None
        assert not hasattr(record, "error_code")
        assert "Traceback" in _formatted(_record(exc))


def test_other_loggers_are_left_alone() -> None:
    record = _record(ApplicationError("x", type="PROVIDER_UNAVAILABLE"), name="aijobs")
    assert ExpectedFailureFilter().filter(record)
    assert record.exc_info is not None
