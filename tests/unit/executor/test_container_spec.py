"""`container:` / `services:` read into specs: the options subset, refusals naming the option,
health defaults, port clashes (docs/containers.md)."""

from __future__ import annotations

from typing import Any

import pytest

from dynrunner.executor.containers.podman import auth_file, registry_of
from dynrunner.executor.containers.spec import (
    ContainerSpec,
    Health,
    SpecError,
    duration,
    port_clashes,
    read_job_containers,
)


def text(where: str, value: Any) -> str:
    return "" if value is None else str(value).replace("${{ secrets.PW }}", "hunter2")


def test_a_string_container_is_its_image_and_services_keep_their_order() -> None:
    job, services = read_job_containers("debian:12", {"redis": {"image": "redis:7"}, "db": "postgres:16"}, text)
    assert job == ContainerSpec(name="job", image="debian:12")
    assert [(s.name, s.image, s.is_service) for s in services] == [
        ("redis", "redis:7", True),
        ("db", "postgres:16", True),
    ]


def test_the_supported_options_are_read() -> None:
    raw = {
        "image": "docker://node:20",
        "env": {"A": "1"},
        "credentials": {"username": "me", "password": "${{ secrets.PW }}"},
        "volumes": ["cache:/cache", "data:/data:ro"],
        "ports": ["6379", "8080:80"],
        "options": "--user 1000:1000 --cpus=2 -m 1g --health-cmd 'redis-cli ping' --health-interval 2s "
        "--health-timeout=1s --health-retries 5 --health-start-period 1m30s -e B=2 --workdir /w --entrypoint /x",
    }
    job, _ = read_job_containers(raw, {}, text)
    assert job == ContainerSpec(
        name="job",
        image="node:20",
        env={"A": "1", "B": "2"},
        credentials=("me", "hunter2"),
        volumes=("cache:/cache", "data:/data:ro"),
        ports=("6379", "8080:80"),
        user="1000:1000",
        cpus="2",
        memory="1g",
        workdir="/w",
        entrypoint="/x",
        health=Health(command="redis-cli ping", interval_s=2.0, timeout_s=1.0, retries=5, start_period_s=90.0),
    )


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        ("--privileged", "--privileged"),
        ("--cap-add=SYS_ADMIN", "--cap-add"),
        ("--network host", "--network"),
        ("--user 1 -v /:/host", "-v"),
    ],
)
def test_any_other_option_fails_naming_it(options: str, refused: str) -> None:
    with pytest.raises(SpecError, match=f"`{refused}` is not supported in `options`"):
        read_job_containers({"image": "x", "options": options}, {}, text)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"env": {}}, "has no `image`"),
        ({"image": "x", "command": "y"}, r"unknown key\(s\) command"),
        ({"image": "x", "credentials": {"username": "u"}}, "needs both `username` and `password`"),
        ({"image": "x", "volumes": ["relative"]}, "expected name:/path"),
        ({"image": "x", "volumes": ["/:/host"]}, "only named volumes are mounted, never a path of the machine"),
        ({"image": "x", "volumes": ["./here:/here"]}, "only named volumes are mounted"),
        ({"image": "x", "options": "--health-interval 5s"}, "health options without `--health-cmd`"),
        ({"image": "x", "options": "--health-cmd true --health-interval soon"}, "expected a duration"),
        ({"image": "x", "options": "--user"}, "needs a value"),
        ({"image": "x", "options": "-e NOVALUE"}, "expected NAME=value"),
        (["x"], "must be an image name or a mapping"),
        ("--privileged", "'--privileged' is not an image name"),
        ({"image": "alpine --privileged"}, "is not an image name"),
    ],
)
def test_bad_values_fail_clearly(raw: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        read_job_containers(raw, {}, text)


def test_health_defaults_are_dockers() -> None:
    _, (svc,) = read_job_containers(None, {"db": {"image": "x", "options": "--health-cmd true"}}, text)
    assert svc.health == Health(command="true", interval_s=30.0, timeout_s=30.0, retries=3, start_period_s=0.0)


def test_a_service_name_must_be_a_host_name() -> None:
    with pytest.raises(SpecError, match="service name 'my db'"):
        read_job_containers(None, {"my db": "x"}, text)


def test_durations() -> None:
    assert duration("500ms", "--x") == 0.5
    assert duration("1h2m3s", "--x") == 3723.0


def test_two_services_on_one_port_clash() -> None:
    assert port_clashes({"a": {"5432"}, "b": {"5432", "80"}, "c": {"81"}}) == [
        "services `a` and `b` both listen on port 5432"
    ]


def test_credentials_become_an_auth_file_per_registry() -> None:
    specs = [
        ContainerSpec(name="job", image="registry.example.org:5000/team/img:1", credentials=("u", "p")),
        ContainerSpec(name="db", image="postgres:16", credentials=("d", "q")),
        ContainerSpec(name="c", image="localhost/x"),
    ]
    assert auth_file(specs) == {"auths": {"registry.example.org:5000": {"auth": "dTpw"}, "docker.io": {"auth": "ZDpx"}}}
    assert registry_of("library/redis") == "docker.io"
    assert registry_of("localhost/x") == "localhost"


def test_a_container_whose_image_evaluates_to_nothing_is_no_container() -> None:
    def empty(where: str, value: Any) -> str:
        return "" if value == "${{ matrix.image }}" else str(value)

    assert read_job_containers("${{ matrix.image }}", {}, empty) == (None, [])
    assert read_job_containers({"image": "${{ matrix.image }}", "env": {"A": "1"}}, {}, empty) == (None, [])
