"""Authenticated external NATS, against real nats-servers configured for each way: user and
password, token, nkey, a `.creds` file (operator mode), TLS with a CA and a client
certificate; the configuration's rules; and `check`'s warning about a server that lets
anyone in."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nkeys
import pytest
import yaml

from dynrunner.controller.assignments.log import AssignmentLog, AssignmentLogError, connect_nats
from dynrunner.controller.checks import run_checks
from dynrunner.controller.config.model import ConfigError, NatsConfig, load_config
from dynrunner.controller.infra.nats_auth import client_options
from dynrunner.controller.infra.sealing import Sealer
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.controller_samples import make_assignment
from tests.fixtures.harness import config_data
from tests.fixtures.nats import NatsServer
from tests.fixtures.nats_auth import make_pki, new_seed, operator_setup, public_key


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[NatsServer]]:
    servers: list[NatsServer] = []
    yield servers
    for server in servers:
        server.close()


def serve(started: list[NatsServer], directory: Path, conf: str) -> NatsServer:
    server = NatsServer(directory, conf)
    server.start()
    started.append(server)
    return server


def secret(directory: Path, name: str, value: str) -> Path:
    path = directory / name
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def nats_cfg(url: str, **auth: Any) -> NatsConfig:
    return NatsConfig(url=url, stream="T_AUTH", subject_prefix="test.auth", registrations_bucket="T_AUTH_R", **auth)


@pytest.mark.parametrize("way", ["user", "token", "nkey"])
async def test_each_way_of_authenticating_reaches_jetstream_and_wrong_credentials_do_not(
    started: list[NatsServer], tmp_path: Path, way: str
) -> None:
    if way == "user":
        conf = 'authorization { user: "dynrunner", password: "s3cret-Pw" }'
        good = {"user": "dynrunner", "password_file": secret(tmp_path, "pw", "s3cret-Pw")}
        bad = {"user": "dynrunner", "password_file": secret(tmp_path, "pw-bad", "guess")}
    elif way == "token":
        conf = 'authorization { token: "t0ken-Zq" }'
        good = {"token_file": secret(tmp_path, "token", "t0ken-Zq")}
        bad = {"token_file": secret(tmp_path, "token-bad", "guess")}
    else:
        seed = new_seed(nkeys.PREFIX_BYTE_USER)
        conf = f'authorization {{ users: [ {{ nkey: "{public_key(seed)}" }} ] }}'
        good = {"nkey_seed_file": secret(tmp_path, "user.nk", seed.decode())}
        bad = {"nkey_seed_file": secret(tmp_path, "other.nk", new_seed(nkeys.PREFIX_BYTE_USER).decode())}
    server = serve(started, tmp_path / "nats", conf)
    cfg = nats_cfg(server.url, **good)
    log = await AssignmentLog.connect(server.url, cfg, ["pod"], options=client_options(cfg))
    try:
        assert await log.publish(Sealer(bytes(32)).seal_assignment(make_assignment())) == 1
    finally:
        await log.close()
    for options in ({}, client_options(nats_cfg(server.url, **bad))):
        with pytest.raises(AssignmentLogError):
            await connect_nats(server.url, options=options, connect_wait_s=1)


async def test_a_creds_file_authenticates_in_operator_mode(started: list[NatsServer], tmp_path: Path) -> None:
    conf, creds = operator_setup(tmp_path)
    server = serve(started, tmp_path / "nats", conf)
    cfg = nats_cfg(server.url, creds_file=creds)
    nc = await connect_nats(server.url, options=client_options(cfg), connect_wait_s=2)
    try:
        got = await nc.subscribe("probe")
        await nc.publish("probe", b"x")
        assert (await got.next_msg(timeout=2)).data == b"x"
    finally:
        await nc.close()
    with pytest.raises(AssignmentLogError):
        await connect_nats(server.url, connect_wait_s=1)


async def test_tls_with_a_ca_and_a_client_certificate(started: list[NatsServer], tmp_path: Path) -> None:
    """The server verifies the client's certificate; the client verifies the server's against the CA."""
    pki = make_pki(tmp_path / "pki")
    conf = (
        f'tls {{ cert_file: "{pki.server_cert}", key_file: "{pki.server_key}", ca_file: "{pki.ca}", verify: true }}\n'
        'authorization { user: "dynrunner", password: "s3cret-Pw" }'
    )
    server = serve(started, tmp_path / "nats", conf)
    url = f"tls://127.0.0.1:{server.port}"
    password = secret(tmp_path, "pw", "s3cret-Pw")
    tls = {"ca_file": pki.ca, "cert_file": pki.client_cert, "key_file": pki.client_key}
    cfg = nats_cfg(url, user="dynrunner", password_file=password, tls=tls)
    log = await AssignmentLog.connect(url, cfg, ["pod"], options=client_options(cfg))
    try:
        assert await log.publish(Sealer(bytes(32)).seal_assignment(make_assignment())) == 1
    finally:
        await log.close()
    without_client_cert = nats_cfg(url, user="dynrunner", password_file=password, tls={"ca_file": pki.ca})
    with pytest.raises(AssignmentLogError):
        await connect_nats(url, options=client_options(without_client_cert), connect_wait_s=1)
    without_ca = nats_cfg(
        url, user="dynrunner", password_file=password, tls={k: v for k, v in tls.items() if k != "ca_file"}
    )
    with pytest.raises(AssignmentLogError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        await connect_nats(url, options=client_options(without_ca), connect_wait_s=1)


def test_the_settings_and_their_environment_variables(tmp_path: Path) -> None:
    token = secret(tmp_path, "token", "t0ken")
    pki = make_pki(tmp_path / "pki")
    env = {
        "DYNRUNNER_GITEA_URL": "https://gitea.example.com",
        "DYNRUNNER_GITEA_REGISTRATION_TOKEN": "r" * 40,
        "DYNRUNNER_NATS_URL": "tls://nats.example.com:4222",
        "DYNRUNNER_NATS_TOKEN_FILE": str(token),
        "DYNRUNNER_NATS_TLS_CA_FILE": str(pki.ca),
        "DYNRUNNER_NATS_TLS_CERT_FILE": str(pki.client_cert),
        "DYNRUNNER_NATS_TLS_KEY_FILE": str(pki.client_key),
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"pools": [{"name": "p", "labels": ["x"]}]}))
    cfg = load_config(path, env).nats
    assert cfg.token() == "t0ken" and cfg.tls.ca_file == pki.ca and cfg.tls.key_file == pki.client_key
    assert "t0ken" not in repr(cfg)
    options = client_options(cfg)
    assert options["token"] == "t0ken" and "tls" in options


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"tokenFile": "token", "user": "u", "passwordFile": "token"}, "one way to authenticate"),
        ({"user": "u"}, "user and passwordFile go together"),
        ({"tokenFile": "missing"}, "tokenFile .*missing cannot be read"),
        ({"tls": {"certFile": "token"}}, "certFile and keyFile go together"),
        ({"url": "nats://u:p@nats:4222", "tokenFile": "token"}, "carries user:password@"),
        ({"url": None, "tokenFile": "token"}, "the embedded server makes its own credentials"),
    ],
)
def test_unworkable_settings_are_refused_with_their_key(tmp_path: Path, settings: dict[str, Any], problem: str) -> None:
    secret(tmp_path, "token", "t0ken")
    nats = {"url": "nats://nats:4222", **settings}
    if nats["url"] is None:
        nats.pop("url")
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "gitea": {"url": "https://gitea.example.com", "registrationToken": "r" * 40},
                "nats": nats,
                "pools": [{"name": "p", "labels": ["x"]}],
                "stateDir": str(tmp_path / "state"),
            }
        )
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert any(__import__("re").search(problem, p) for p in caught.value.problems), caught.value.problems


async def test_check_warns_when_the_server_lets_anyone_in(
    gitea: GiteaDouble, started: list[NatsServer], tmp_path: Path
) -> None:
    open_server = serve(started, tmp_path / "open", "")
    closed = serve(started, tmp_path / "closed", 'authorization { user: "dynrunner", password: "s3cret-Pw" }')
    password = secret(tmp_path, "pw", "s3cret-Pw")
    for server, auth, warned in (
        (open_server, {}, True),
        (closed, {"user": "dynrunner", "passwordFile": str(password)}, False),
    ):
        data = config_data(
            gitea_url=gitea.url,
            registration_token=gitea.registration_token,
            state_dir=tmp_path / "state",
            nats_url=server.url,
            nats=auth,
        )
        path = tmp_path / "controller.yaml"
        path.write_text(yaml.safe_dump(data))
        out = io.StringIO()
        assert await run_checks(path, out) == 0, out.getvalue()
        lines = out.getvalue().splitlines()
        warnings = [line for line in lines if line.startswith("WARN nats: ")]
        assert bool(warnings) == warned, lines
        assert any(line.startswith("OK   nats: ") for line in lines), lines
        if warned:
            assert "accepts clients without credentials" in warnings[0]
