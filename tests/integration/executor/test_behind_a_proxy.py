"""A job reported through a front end that limits request bodies as nginx does by default."""

from __future__ import annotations

import dataclasses

from tests.fixtures.executor import ExecutorHarness
from tests.fixtures.faults import fault_proxy

MIB = 1024 * 1024

# One step output just under the job's 1 MiB budget for step outputs; three job outputs of
# exactly 1 MiB (Gitea's largest) made of it. Base64 of random bytes compresses least of text.
WORKFLOW = f"""
on: push
jobs:
  build:
    runs-on: self-hosted
    outputs:
      a: ${{{{ steps.gen.outputs.v }}}}a
      b: ${{{{ steps.gen.outputs.v }}}}b
      c: ${{{{ steps.gen.outputs.v }}}}c
      version: 1.2.3
    steps:
      - id: gen
        run: |
          {{ printf 'v='; head -c {MIB} /dev/urandom | base64 -w0 | head -c {MIB - 1}; echo; }} >> "$GITHUB_OUTPUT"
      - run: echo done
"""


async def test_a_job_with_outputs_of_a_mebibyte_each_passes_nginx_default_body_limit(
    executor_harness: ExecutorHarness,
) -> None:
    """Before, all pending outputs went in one UpdateTask: 3 MiB, answered 413 by the proxy,
    which stopped reporting and lost the job."""
    claimed = await executor_harness.claim(WORKFLOW)
    async with fault_proxy(executor_harness.gitea.url, max_body=MIB) as proxy:
        assignment = dataclasses.replace(claimed.assignment, gitea_url=proxy.url)
        assert await executor_harness.run(assignment) == 0
    task = executor_harness.gitea.task(claimed.task_id)
    assert task.status == "success", task.log_rows[-20:]
    assert sorted(task.outputs) == ["a", "b", "c", "version"]
    assert {len(task.outputs[k].encode()) for k in "abc"} == {MIB}
    assert task.outputs["a"][:-1] == task.outputs["b"][:-1] and task.outputs["version"] == "1.2.3"
    assert proxy.answered == []
    assert max(size for _, size in proxy.forwarded) <= MIB
