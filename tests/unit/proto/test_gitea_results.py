"""Result values the client does not know read as UNSPECIFIED instead of failing the call:
`TaskNeed.result` is a Gitea status cast to Result (`findTaskNeeds`), so a non-final status
(5 waiting … 8 cancelling) or a value added by a newer server can arrive."""

from __future__ import annotations

import pytest

from dynrunner.proto._gen.runner.v1 import messages_pb2 as pb
from dynrunner.proto.gitea import Result, Task, TaskState


@pytest.mark.parametrize(("wire", "expected"), [(1, Result.SUCCESS), (4, Result.SKIPPED), (6, Result.UNSPECIFIED)])
def test_need_results(wire: int, expected: Result) -> None:
    msg = pb.Task(id=1)
    msg.needs["build"].result = wire
    assert Task.from_proto(msg).needs["build"].result is expected


def test_task_and_step_states() -> None:
    state = pb.TaskState(id=3, result=9, steps=[pb.StepState(id=0, result=2)])  # type: ignore[arg-type]
    parsed = TaskState.from_proto(state)
    assert (parsed.result, parsed.steps[0].result) == (Result.UNSPECIFIED, Result.FAILURE)
