"""What `uses:` names, and which hosts may receive the task token."""

from __future__ import annotations

import pytest

from dynrunner.executor.actions.reference import (
    DockerAction,
    LocalAction,
    ReferenceError,
    RemoteAction,
    parse_uses,
    token_allowed,
)

GITEA = "https://gitea.example.org/git"


def parse(uses: str, default: str = "https://github.com") -> object:
    return parse_uses(uses, default_actions_url=default, gitea_urls=(GITEA, "http://gitea:3000"))


def test_forms() -> None:
    assert parse("./.github/actions/x") == LocalAction("./.github/actions/x")
    assert parse("docker://alpine:3") == DockerAction("alpine:3")
    assert parse("actions/checkout@v4") == RemoteAction("https://github.com", "actions", "checkout", "", "v4")
    assert parse("actions/cache/restore@v4", GITEA) == RemoteAction(GITEA, "actions", "cache", "restore", "v4")
    assert parse("o/r/deep/er/@release/v1") == RemoteAction("https://github.com", "o", "r", "deep/er", "release/v1")
    assert parse("https://codeberg.org/o/r@v1") == RemoteAction("https://codeberg.org", "o", "r", "", "v1")
    assert parse("http://127.0.0.1:8080/o/r/p@" + "a" * 40) == RemoteAction(
        "http://127.0.0.1:8080", "o", "r", "p", "a" * 40
    )
    # the Gitea instance at a sub-path: the rest is owner/repo
    assert parse(f"{GITEA}/o/r@v1") == RemoteAction(GITEA, "o", "r", "", "v1")
    assert str(parse("o/r/p@v1")) == "o/r/p@v1"
    assert parse("o/r@v1").clone_url == "https://github.com/o/r"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "uses",
    [
        "actions/checkout",
        "checkout@v4",
        "o/r@",
        "o//r@v1",
        "o/r/../x@v1",
        "ftp://h/o/r@v1",
        "docker://",
        "o/r@--upload-pack=touch /tmp/x",
        "https://h/o/r@-q",
    ],
)
def test_names_that_are_no_action(uses: str) -> None:
    with pytest.raises(ReferenceError):
        parse(uses)


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://gitea.example.org/git/o/r", True),
        ("https://GITEA.example.org:443/o/r", True),
        ("http://gitea.example.org/git/o/r", False),  # another scheme is another server
        ("https://gitea.example.org:8443/o/r", False),  # another port too
        ("https://user:pw@gitea.example.org/o/r", False),  # credentials of its own
        ("https://gitea.example.org.evil.test/o/r", False),
        ("https://github.com/o/r", False),
        ("http://gitea:3000/o/r", True),
        ("http://gitea/o/r", False),
        ("not a url", False),
    ],
)
def test_the_token_goes_to_the_gitea_instance_only(url: str, allowed: bool) -> None:
    assert token_allowed(url, (GITEA, "http://gitea:3000")) is allowed
