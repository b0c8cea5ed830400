"""The end-to-end tests answer as Gitea 1.26, the release most users run (issue 10).

A test whose behaviour differs on Gitea's main branch runs against both:
`@pytest.mark.parametrize("gitea_profile", ["1.26", "main"])` (cancellation, two controllers
on one queue, outages). The others run once, against 1.26, to keep the suite's time.
"""

from __future__ import annotations

import pytest

E2E_PROFILE = "1.26"


@pytest.fixture
def gitea_profile() -> str:
    return E2E_PROFILE
