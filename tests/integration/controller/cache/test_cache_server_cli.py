"""`dynrunner-controller cache-server`: the cache on its own, for controllers elsewhere."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp
import yaml

from dynrunner.controller.config.model import ConfigError, load_cache_server_config
from dynrunner.controller.infra.sealing import ensure_key_file

CLI = str(Path(sys.executable).parent / "dynrunner-controller")


async def _start(config: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        CLI, "cache-server", "--config", str(config), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


def _write(path: Path, cache: dict[str, object], **top: object) -> Path:
    path.write_text(yaml.safe_dump({"cache": cache, "logging": {"json": False}, **top}))
    return path


async def test_it_serves_until_sigterm_with_the_shared_key(tmp_path: Path, reserved_port: int) -> None:
    port = reserved_port
    key = ensure_key_file(tmp_path / "cache.key")
    cache = {"url": f"http://127.0.0.1:{port}", "listen": f"127.0.0.1:{port}", "keyFile": str(key)}
    # the controllers' own file works too: sections other than cache, logging and stateDir are ignored
    config = _write(tmp_path / "c.yaml", cache, gitea={"url": "http://gitea"}, stateDir=str(tmp_path / "state"))
    output = tmp_path / "cache-server.log"
    with output.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            CLI, "cache-server", "--config", str(config), stdout=sink, stderr=asyncio.subprocess.STDOUT
        )
    try:
        # A start under load (imports, the index) may take long: bounded by time, and a
        # server that exited says why instead of the wait running out.
        deadline = asyncio.get_running_loop().time() + 90
        async with aiohttp.ClientSession() as http:
            while True:
                assert process.returncode is None, f"the cache server exited: {output.read_text()}"
                assert asyncio.get_running_loop().time() < deadline, f"never answered: {output.read_text()}"
                try:
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                        assert response.status == 200
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 60) == 0, output.read_text()
    assert (tmp_path / "state" / "cache" / "index.db").exists()


async def test_it_refuses_to_start_without_the_key_controllers_share(tmp_path: Path) -> None:
    cache = {"url": "http://127.0.0.1:1", "listen": "127.0.0.1:0", "keyFile": str(tmp_path / "missing.key")}
    process = await _start(_write(tmp_path / "c.yaml", cache))
    _, err = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 1
    assert b"cache key file (cache.keyFile)" in err


async def test_a_configuration_without_a_url_is_a_usage_error(tmp_path: Path) -> None:
    process = await _start(_write(tmp_path / "c.yaml", {"listen": "127.0.0.1:0"}))
    _, err = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 2 and b"cache.url is required" in err


def test_the_section_has_safe_defaults_and_checks_its_limits(tmp_path: Path) -> None:
    cfg = load_cache_server_config(_write(tmp_path / "c.yaml", {"url": "http://cache:8089/"}), env={})
    assert cfg.cache.url == "http://cache:8089" and cfg.cache.v2 and cfg.cache.serve
    assert cfg.cache.dir is not None and cfg.cache.dir.name == "cache"
    try:
        load_cache_server_config(
            _write(tmp_path / "d.yaml", {"url": "http://c", "maxEntryBytes": 10, "repoSizeLimitBytes": 5}), env={}
        )
    except ConfigError as err:
        assert "maxEntryBytes must not exceed repoSizeLimitBytes" in str(err)
    else:
        raise AssertionError("accepted an entry limit over the repository limit")
    env = {"DYNRUNNER_CACHE_URL": "http://from-env", "DYNRUNNER_CACHE_RETENTION_DAYS": "2"}
    from_env = load_cache_server_config(None, env=env)
    assert (from_env.cache.url, from_env.cache.retention_days) == ("http://from-env", 2.0)
