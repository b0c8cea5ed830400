"""`dynrunner-opensandbox-double serve` as a process: it announces itself, serves the SDK, and
kills its sandboxes when it stops."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

from opensandbox import Sandbox, SandboxManager

from tests.fixtures.opensandbox import sdk_config

CLI = Path(sys.executable).with_name("dynrunner-opensandbox-double")
MARK = "613.0417"  # a sleep no other test runs


async def test_serve_prints_its_url_and_key_and_stops_on_sigterm(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        str(CLI),
        "serve",
        "--state-dir",
        str(tmp_path),
        "--image",
        "shell:1",
        "--api-key",
        "k",
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    started = json.loads(await asyncio.wait_for(process.stdout.readline(), 30))
    assert started["api_key"] == "k"

    class Announced:
        url = started["url"]
        api_key = "k"

    config = sdk_config(Announced)  # type: ignore[arg-type]
    sandbox = await Sandbox.create("shell:1", entrypoint=["sleep", MARK], connection_config=config)
    manager = await SandboxManager.create(connection_config=config)
    assert (await manager.get_sandbox_info(sandbox.id)).status.state == "Running"
    assert _running(MARK)
    await manager.close()
    await sandbox.close()
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 30) == 0
    assert not _running(MARK)


def _running(argument: str) -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if argument.encode() in cmdline.read_bytes().split(b"\0"):
                return True
        except OSError:
            continue
    return False
