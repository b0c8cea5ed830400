"""JSON logs: one object per line, carrying the ids bound with log_context, also in tasks."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from dynrunner.controller.infra.logs import configure_logging, current_context, log_context


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging("debug", json=True, stream=out)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def records(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_records_carry_context_ids(stream: io.StringIO) -> None:
    log = logging.getLogger("dynrunner.test")
    log.info("before")
    with log_context(pool="pod"), log_context(assignment_id="a-1", task_id=42, unused=None):
        log.warning("launching %s", "env-1", extra={"attempt": 2})
        assert current_context() == {"pool": "pod", "assignment_id": "a-1", "task_id": 42}
    log.info("after")
    first, inside, after = records(stream)
    assert first["message"] == "before" and "pool" not in first
    assert inside["message"] == "launching env-1"
    assert (inside["level"], inside["logger"]) == ("warning", "dynrunner.test")
    assert (inside["pool"], inside["assignment_id"], inside["task_id"], inside["attempt"]) == ("pod", "a-1", 42, 2)
    assert "unused" not in inside
    assert "assignment_id" not in after
    assert str(inside["time"]).endswith("+00:00")


async def test_context_follows_tasks_started_inside(stream: io.StringIO) -> None:
    log = logging.getLogger("dynrunner.test")

    async def work() -> None:
        await asyncio.sleep(0)
        log.info("in task")

    with log_context(assignment_id="a-9", task_id=7):
        task = asyncio.create_task(work())
    log.info("outside")
    await task
    by_message = {r["message"]: r for r in records(stream)}
    assert by_message["in task"]["assignment_id"] == "a-9"
    assert "assignment_id" not in by_message["outside"]


def test_exceptions_are_one_line_of_json(stream: io.StringIO) -> None:
    try:
        raise ValueError("bad input")
    except ValueError:
        logging.getLogger("dynrunner.test").exception("failed")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    [record] = records(stream)
    assert "ValueError: bad input" in str(record["exception"])


def test_unserializable_extra_is_stringified(stream: io.StringIO) -> None:
    logging.getLogger("dynrunner.test").info("x", extra={"obj": object()})
    assert str(records(stream)[0]["obj"]).startswith("<object object")


def test_text_format_appends_ids() -> None:
    out = io.StringIO()
    handler = configure_logging("info", json=False, stream=out)
    try:
        with log_context(task_id=5):
            logging.getLogger("dynrunner.test").info("hello")
    finally:
        logging.getLogger().removeHandler(handler)
    assert out.getvalue().rstrip().endswith("dynrunner.test: hello task_id=5")


def test_configure_twice_keeps_one_handler() -> None:
    root = logging.getLogger()
    first = configure_logging("info", stream=io.StringIO())
    second = configure_logging("info", stream=io.StringIO())
    try:
        assert first not in root.handlers and second in root.handlers
    finally:
        root.removeHandler(second)
