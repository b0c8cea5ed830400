"""Opening the actions toolkit's GitHub-only gates in the bundles of fetched JavaScript actions.

JavaScript actions bundle GitHub's `@actions/*` toolkit into their own files. Two places in
it stop stock actions from working against Gitea, and Gitea's runner edits both out of the
bundles it downloads (act_runner's `patch_actions`); so does this executor:

- `isGhes()` takes every server but github.com, `*.ghe.com` and `*.localhost` for GitHub
  Enterprise Server: `@actions/artifact` (upload/download-artifact v4) then refuses to run
  (`GHESNotSupportedError`) and `@actions/cache` stays on its v1 protocol. Its last test,
  `hostname.endsWith('.LOCALHOST')`, loses its suffix (`endsWith('')`, true for any host).
  The test is matched in upper case only: the HTTP client bundled beside it tests a lower-case
  `.localhost` for its own trust decision, which must not change.
- `getCacheServiceURL()` reads `ACTIONS_RESULTS_URL` alone for the v2 cache protocol; both of
  its branches are made to prefer `ACTIONS_CACHE_URL`, as its v1 branch does, so the cache
  goes to the cache server whatever `ACTIONS_RESULTS_URL` names.

- `uploadZipToBlobStorage(url, …)` hands Gitea's signed upload URL to the Azure blob client,
  which drops a trailing `=` of a query value when it appends `comp=block`; Gitea 1.24 signs
  with padded base64url (`sig=…=`) and refuses the signature without it, so every v4 upload
  failed "Error unauthorized" there. The function's first statement now sends each `=` inside
  a query value as `%3D` (which the client keeps and Gitea decodes back); a URL without one
  (1.25 on, GitHub) is unchanged. The cache server's artifact forward does the same for
  every client (docs/cache.md); this edit serves jobs of a pool without a cache server.

Only bundles that carry one of the toolkits are touched (the artifact refusal, or the cache's
v2 switch with its service-URL getter), only the files `runs.pre`, `runs.main` and `runs.post`
name inside the action's directory, only actions fetched for this job (a local action is the
user's own checkout, never rewritten; one in the read-only seeded cache is copied first), and
only files up to 64 MiB.
"""

from __future__ import annotations

import re
from pathlib import Path

from dynrunner.executor.actions.manifest import Manifest

MAX_BUNDLE_BYTES = 64 * 1024 * 1024
_GATE = ".LOCALHOST"
_ARTIFACT_REFUSAL = b"GHESNotSupportedError"
_CACHE_V2 = b"ACTIONS_CACHE_SERVICE_V2"


def _quoted(pattern: str) -> str:
    return "(?:" + "|".join(f"{q}{pattern}{q}" for q in ("'", '"', "`")) + ")"


def _env_read(name: str) -> str:
    """`process.env.NAME` or `process.env['NAME']` (any quotes, any spacing)."""
    return rf"process\s*\.\s*env\s*(?:\.\s*{name}\b|\[\s*{_quoted(name)}\s*\])"


_LOCALHOST_TEST = re.compile(rb"endsWith\s*\(\s*" + _quoted(re.escape(_GATE)).encode() + rb"\s*\)")
# Both branches of the cache service URL getter at once: the v1 branch reads the cache URL,
# then the results URL; the v2 branch, a few bytes on, the results URL alone.
_SERVICE_URL = re.compile(
    (
        "(" + _env_read("ACTIONS_CACHE_URL") + r"\s*\|\|\s*)(" + _env_read("ACTIONS_RESULTS_URL") + r")"
        "((?s:.){0,256}?)(" + _env_read("ACTIONS_RESULTS_URL") + ")"
    ).encode()
)
_CACHE_FIRST = rb"\1(process.env.ACTIONS_CACHE_URL||\2)\3(process.env.ACTIONS_CACHE_URL||\4)"
_BLOB_UPLOAD = re.compile(rb"(function\s+uploadZipToBlobStorage\s*\(\s*([A-Za-z_$][\w$]*)\s*,[^)]*\)\s*\{)")
_ESCAPED_SIG = (
    rb"\1\2=String(\2).replace(/([?&][^=&#]*=)([^&#]*)/g,"
    rb"function(_,k,v){return k+v.split('=').join('%3D')});"
)


def patched_bundle(data: bytes) -> bytes | None:
    """The bundle with the gates open, or None when it has nothing of the toolkit to open."""
    artifact = _ARTIFACT_REFUSAL in data
    cache = _CACHE_V2 in data and _SERVICE_URL.search(data) is not None
    if not (artifact or cache) or _LOCALHOST_TEST.search(data) is None:
        return None
    opened = _LOCALHOST_TEST.sub(lambda m: m.group(0).replace(_GATE.encode(), b"", 1), data)
    if artifact:
        opened = _BLOB_UPLOAD.sub(_ESCAPED_SIG, opened)
    if cache:
        opened = _SERVICE_URL.sub(_CACHE_FIRST, opened)
    return opened


def bundles(directory: Path, manifest: Manifest) -> list[Path]:
    """The stage files of a JavaScript action that lie inside its directory."""
    if manifest.kind != "node":
        return []
    root = directory.resolve()
    found = []
    for script in (manifest.pre, manifest.main, manifest.post):
        if not script:
            continue
        path = (directory / script).resolve()
        if path.is_relative_to(root) and path.is_file() and path.stat().st_size <= MAX_BUNDLE_BYTES:
            found.append(path)
    return found


def needs_patch(directory: Path, manifest: Manifest) -> bool:
    return any(patched_bundle(path.read_bytes()) is not None for path in bundles(directory, manifest))


def patch_action(directory: Path, manifest: Manifest) -> list[Path]:
    """Patch the action's bundles in place; returns the files changed."""
    changed = []
    for path in bundles(directory, manifest):
        opened = patched_bundle(path.read_bytes())
        if opened is not None:
            path.write_bytes(opened)
            changed.append(path)
    return changed
