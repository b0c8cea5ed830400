"""Gitea releases the double answers as: `GiteaDouble(profile="1.26")`, `serve --profile 1.26`.

A `Profile` records, for one release line, each server rule a runner can observe that
differs between Gitea 1.24, 1.25, 1.26 and `main`, read from that tag's sources in the
Gitea repository (docs/gitea-double.md cites the file of each). Everything the profiles do
not name is the same in all of them (and follows `main`, see docs/gitea-double.md).

The engine holds its profile as `engine.profile`; any endpoint of the double (runner API,
artifacts, git over HTTP, ...) consults it there when a release matters to it. A new
difference is a new field here (`main`'s rule in `MAIN`, the older one in the release that
still had it, which the releases before inherit), never a version comparison at a call site.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

HOUR_S = 3600


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    """"1.24", "1.25", "1.26" or "main"."""
    tag: str
    """The release the rules were read from."""
    cancelling: bool
    """The runner capability `cancelling` (Register/Declare `capabilities`) is stored, and a
    cancel stops such a runner's task as `cancelling` until it reports (PR #37275). Without it
    `CancelJobs` calls `StopTask(task, cancelled)`: task, job and unfinished steps end at once
    and the ephemeral runner is deleted with them."""
    server_capabilities: str
    """Declare's `X-Gitea-Actions-Capabilities` answer header ("" = not sent)."""
    next_candidate_on_lost_race: bool
    """A claim that loses the race for its job tries the next waiting job (PR #38200); before,
    `CreateTaskForRunner` claims only the first matching job and answers "no task" — with the
    latest tasks_version — when another runner took it first."""
    candidate_page: int | None
    """Waiting jobs scanned per query (keyset pages, PR #38200); None: all at once."""
    bump_when_job_finishes: bool
    """A job that finishes while waiting jobs remain in its repository bumps tasks_version
    (PR #38200); before, only a job becoming waiting (and new runs, disabled runners) do."""
    release_undelivered_claims: bool
    """A FetchTask cancelled (client timeout or disconnect) after its claim releases the job
    (PR #38343); before, the job stays running with nobody on it until the zombie reaper."""
    runtime_token_ttl_s: int | None
    """`gitea_runtime_token` lifetime; None: 1 h + ENDLESS_TASK_TIMEOUT (v1.24.6 and later)."""
    empty_no_more_finalizes: bool
    """UpdateLog with `no_more` and no new rows archives the log (PR #37631); before, such a
    call returns the ack without archiving."""
    debounced_heartbeats: bool
    """The interceptor writes `last_online` at most every 30 s and `last_active` every 5 s
    (PR #38281); before, every authenticated call writes the runner row."""
    pick_throttle: bool
    """`MAX_CONCURRENT_TASK_PICKS` bounds concurrent picks (PR #38281)."""
    reload_runner_before_pick: bool
    """FetchTask reloads the runner before picking ("get runner: ..." when it vanished)."""
    runner_disabling: bool
    """Runners can be disabled (`PATCH .../runners/{id}`, PR #36776): they get no task."""
    padded_artifact_signatures: bool = False
    """Artifacts v4 signed URLs carry `sig` in padded base64url (`base64.URLEncoding`, one
    trailing `=`) and are checked strictly, so a `sig` whose padding a client dropped fails
    "Error unauthorized" (v1.24.6 `routers/api/actions/artifactsv4.go`); from 1.25, unpadded
    (`RawURLEncoding`). The Azure blob client of `@actions/artifact` 2.x drops that `=` when it
    appends `comp=block` to the URL (checked against real 1.24.6: tests/peers/)."""
    event_repository_keys: tuple[str, ...] = (
        "allow_manual_merge",
        "autodetect_manual_merge",
        "has_code",
        "branch_count",
    )
    """The event payload's repository keys this release has beyond 1.24's (`structs.Repository`:
    1.25 added the first three, 1.26 `branch_count`; `events.NEWER_REPOSITORY_KEYS`)."""
    triggering_actor: bool = False
    """The task context's `triggering_actor` is the user who triggered the run (`main`: every
    run has its first attempt); in 1.24–1.26 it is "" (`GenerateGiteaContext`; checked against
    the real releases: tests/peers/test_gitea_contexts.py)."""
    run_prefixed_step_names: bool = True
    """An unnamed step is shown as "Run " + the first line of its `run` (`makeTaskStepDisplayName`,
    1.26); before, as its whole `run` script (or `uses`, or id: act's `Step.String()`)."""


MAIN = Profile(
    name="main",
    tag="main of 2026-07-15",
    cancelling=True,
    server_capabilities="job-summary",
    next_candidate_on_lost_race=True,
    candidate_page=100,
    bump_when_job_finishes=True,
    release_undelivered_claims=True,
    runtime_token_ttl_s=None,
    empty_no_more_finalizes=True,
    debounced_heartbeats=True,
    pick_throttle=True,
    reload_runner_before_pick=True,
    runner_disabling=True,
    triggering_actor=True,
)
V1_26 = dataclasses.replace(
    MAIN,
    name="1.26",
    tag="v1.26.4",
    cancelling=False,
    server_capabilities="",
    next_candidate_on_lost_race=False,
    candidate_page=None,
    bump_when_job_finishes=False,
    release_undelivered_claims=False,
    # v1.26.2 took main's UpdateLog (#37631: an empty `no_more` archives); v1.26.0-1 did not.
    debounced_heartbeats=False,
    pick_throttle=False,
    triggering_actor=False,
)
V1_25 = dataclasses.replace(
    V1_26,
    name="1.25",
    tag="v1.25.5",
    empty_no_more_finalizes=False,
    reload_runner_before_pick=False,
    runner_disabling=False,
    run_prefixed_step_names=False,
    event_repository_keys=("allow_manual_merge", "autodetect_manual_merge", "has_code"),
)
# The newest 1.24 patch (v1.24.6): its runtime token lives 1 h + ENDLESS_TASK_TIMEOUT, as
# later releases; v1.24.0-v1.24.5 gave 24 h (`runtime_token_ttl_s=24 * HOUR_S`).
V1_24 = dataclasses.replace(
    V1_25,
    name="1.24",
    tag="v1.24.6",
    padded_artifact_signatures=True,
    event_repository_keys=(),
)
PROFILES: dict[str, Profile] = {p.name: p for p in (V1_24, V1_25, V1_26, MAIN)}
DEFAULT_PROFILE = "main"


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {name!r}") from None
