"""The actions toolkit's GitHub-only gates, opened in a JavaScript action's bundle."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dynrunner.executor.actions.toolkit import patched_bundle

MINIFIED_CACHE = (
    b'function e(){const t=new URL(process.env.GITHUB_SERVER_URL||"https://github.com").hostname.trimEnd()'
    b'.toUpperCase();return!(t==="GITHUB.COM"||t.endsWith(".GHE.COM")||t.endsWith(".LOCALHOST"))}'
    b'function v(){return e()?"v1":process.env.ACTIONS_CACHE_SERVICE_V2?"v2":"v1"}'
    b'function u(){switch(v()){case"v1":return process.env.ACTIONS_CACHE_URL||process.env.ACTIONS_RESULTS_URL||"";'
    b'case"v2":return process.env.ACTIONS_RESULTS_URL||"";}}'
    b"function trusty(h){return h.endsWith('.localhost')}"
)


def test_a_minified_cache_bundle_opens_both_gates() -> None:
    opened = patched_bundle(MINIFIED_CACHE)
    assert opened is not None
    assert b't.endsWith("")' in opened and b'".LOCALHOST"' not in opened
    assert b"process.env.ACTIONS_CACHE_URL||(process.env.ACTIONS_CACHE_URL||process.env.ACTIONS_RESULTS_URL)" in opened
    assert b'case"v2":return (process.env.ACTIONS_CACHE_URL||process.env.ACTIONS_RESULTS_URL)||""' in opened
    assert b"h.endsWith('.localhost')" in opened  # the HTTP client's own trust test stays


def test_the_artifact_gate_opens_alone() -> None:
    bundle = b"class GHESNotSupportedError extends Error{} const g = host.endsWith( `.LOCALHOST` );"
    assert patched_bundle(bundle) == b"class GHESNotSupportedError extends Error{} const g = host.endsWith( `` );"


@pytest.mark.parametrize(
    "bundle",
    [
        b"console.log('no toolkit here'); x.endsWith('.LOCALHOST')",  # a gate-like test, no toolkit
        b"class GHESNotSupportedError {}",  # the toolkit without the gate: nothing to open
        b"ACTIONS_CACHE_SERVICE_V2 x.endsWith('.LOCALHOST')",  # the cache switch without its getter
    ],
)
def test_bundles_without_what_the_patch_opens_are_left_alone(bundle: bytes) -> None:
    assert patched_bundle(bundle) is None


BLOB_UPLOAD = (
    b"class GHESNotSupportedError extends Error{} const g = 'h'.endsWith('.LOCALHOST');\n"
    b"function uploadZipToBlobStorage(authenticatedUploadURL, zipUploadStream) {\n"
    b"    return authenticatedUploadURL;\n"
    b"}\n"
    b"console.log(uploadZipToBlobStorage(process.argv[2], null));\n"
)


@pytest.mark.parametrize(
    ("url", "sent"),
    [
        # Gitea 1.24's padded signature: the `=` travels escaped, Gitea decodes it back.
        (
            "http://g/UploadArtifact?sig=YWJj=&expires=2026&taskID=1",
            "http://g/UploadArtifact?sig=YWJj%3D&expires=2026&taskID=1",
        ),
        # 1.25 on (unpadded) and GitHub's SAS URLs: unchanged.
        (
            "http://g/UploadArtifact?sig=YWJj&expires=2026&taskID=1",
            "http://g/UploadArtifact?sig=YWJj&expires=2026&taskID=1",
        ),
        ("https://b.blob/c/a.zip?sv=2023&sig=a%2Bb%3D", "https://b.blob/c/a.zip?sv=2023&sig=a%2Bb%3D"),
    ],
)
def test_the_artifact_upload_url_keeps_its_signature_padding(tmp_path: Path, url: str, sent: str) -> None:
    """The blob client drops a value's trailing `=` (Gitea 1.24's padded `sig`): the patched
    upload function escapes it first. Run by Node, as a job runs the bundle."""
    opened = patched_bundle(BLOB_UPLOAD)
    assert opened is not None
    script = tmp_path / "index.js"
    script.write_bytes(opened)
    done = subprocess.run(["node", str(script), url], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == sent
