"""The services a job's actions reach besides Gitea's runner API, and where the step
environment points them (the `ACTIONS_*` contract, docs/executor.md).

Gitea serves artifacts itself (ACTIONS_RUNTIME_URL for v3, ACTIONS_RESULTS_URL for v4; both set
by `contexts.runner_env`). The cache is a dynrunner service (docs/cache.md). When the assignment
names a cache server, the job registers its runtime token there with the controller's grant as
it starts, and revokes it when its steps are done. Then, as act_runner does with its cache
server:

* `ACTIONS_CACHE_URL` = `<cache url>/`: the v1 protocol (the toolkit appends `_apis/...`);
* `ACTIONS_RESULTS_URL` = `<cache url>`: the server is the whole results service, the cache half
  itself and the artifact half forwarded to Gitea, so v2 cache clients and v4 artifact clients
  share the one variable (only when the server says it forwards for this job);
* `ACTIONS_CACHE_SERVICE_V2` = `true` when the assignment offers v2 (clients that take the
  server for GitHub Enterprise keep to v1 whatever this says).

A cache that cannot be reached or refuses the registration leaves the job without a cache (a
warning in the log says why), never failed: a cache is an optimisation.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from dynrunner.proto.assignment import CacheServiceOptions

TIMEOUT_S = 10.0
ATTEMPTS = 3


class ServiceError(Exception):
    """The cache server could not be reached or refused the job."""


@dataclass(frozen=True, slots=True)
class ActionsServices:
    cache_url: str = ""
    results_url: str = ""
    v2: bool = False
    token: str = ""

    def env(self) -> dict[str, str]:
        """What these services add to (or override in) the runner's step environment."""
        if not self.cache_url:
            return {}
        env = {"ACTIONS_CACHE_URL": f"{self.cache_url}/"}
        if self.results_url:
            env["ACTIONS_RESULTS_URL"] = self.results_url
            if self.v2:
                env["ACTIONS_CACHE_SERVICE_V2"] = "true"
        return env


NONE = ActionsServices()


def _post(url: str, body: dict[str, str]) -> dict[str, object]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            text = response.read()
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:500]
        try:
            detail = str(json.loads(detail).get("message", detail))
        except (ValueError, AttributeError):
            pass
        raise ServiceError(f"HTTP {err.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as err:
        raise ServiceError(str(getattr(err, "reason", err))) from None
    if not text.strip():
        return {}
    answer = json.loads(text)
    return answer if isinstance(answer, dict) else {}


async def open_services(
    options: CacheServiceOptions, runtime_token: str, warn: Callable[[str], None]
) -> ActionsServices:
    """Register the job's runtime token with its cache server; NONE when there is no cache or
    it cannot be used (after saying why through `warn`)."""
    if not options.url:
        return NONE
    if not options.grant or not runtime_token:
        warn("The cache is not available to this job: the controller issued it no cache grant.")
        return NONE
    url = options.url.rstrip("/")
    error: ServiceError | None = None
    for attempt in range(ATTEMPTS):
        try:
            answer = await asyncio.to_thread(
                _post, f"{url}/_dynrunner/register", {"grant": options.grant, "token": runtime_token}
            )
            results = str(answer.get("results_url") or "")
            return ActionsServices(cache_url=url, results_url=results, v2=options.v2, token=runtime_token)
        except (ServiceError, ValueError) as err:
            error = err if isinstance(err, ServiceError) else ServiceError(f"unreadable answer: {err}")
            if "HTTP 4" in str(error):
                break
            await asyncio.sleep(0.25 * (attempt + 1))
    warn(f"The cache server at {url} could not be used, so this job runs without a cache: {error}")
    return NONE


async def close_services(services: ActionsServices) -> None:
    """Revoke the job's registration (best effort: the grant expires at the job's deadline anyway)."""
    if not services.cache_url:
        return
    try:
        await asyncio.to_thread(_post, f"{services.cache_url}/_dynrunner/revoke", {"token": services.token})
    except (ServiceError, ValueError):
        pass
