"""What a cold machine builds first when its peers budget is short (tests/fixtures/peers.py)."""

from __future__ import annotations

from tests.fixtures.peers import RECIPES, build_order


def test_the_newest_of_every_peer_comes_before_any_older_gitea_line() -> None:
    order = [(r.name, r.line) for r in build_order()]
    assert sorted(order) == sorted((r.name, r.line) for r in RECIPES), "every recipe, once"
    names = [name for name, _ in order]
    firsts = names[: len(set(names))]
    assert sorted(firsts) == sorted(set(names)), "one of each peer before any second line"
    assert order[0] == ("gitea", "1.26")
    gitea = [line for name, line in order if name == "gitea"]
    assert gitea == sorted(gitea, key=lambda line: tuple(map(int, line.split("."))), reverse=True)
