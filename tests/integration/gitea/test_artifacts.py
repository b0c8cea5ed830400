"""The double's artifact endpoints at the wire: auth, run checks, signatures, chunk rules.
(The happy paths are proven with the real clients in tests/integration/services/.)"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import time
import zipfile
from urllib.parse import parse_qs, quote_plus, urlsplit

import pyqwest
import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.gitea.artifacts_v4 import go_time, parse_go_time
from dynrunner.proto.gitea import GiteaClient, Result, Task
from tests.fixtures.gitea_calls import final_state, job, register, workflow

V4 = "/twirp/github.actions.results.api.v1.ArtifactService"


async def _claim(gitea: GiteaDouble) -> tuple[GiteaClient, Task]:
    gitea.submit("acme/app", workflow(job("build")))
    runner = await register(gitea)
    fetched = await runner.fetch_task(0)
    assert fetched.task is not None
    return runner, fetched.task


def _bearer(task: Task, *, jwt: bool = True) -> dict[str, str]:
    token = task.context["gitea_runtime_token"] if jwt else task.context["token"]
    return {"authorization": f"Bearer {token}"}


async def _call(
    method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None
) -> pyqwest.FullResponse:
    return await pyqwest.Client().execute(method, url, headers=headers or {}, content=body)


async def _rpc(gitea: GiteaDouble, task: Task, name: str, body: dict[str, object]) -> pyqwest.FullResponse:
    return await _call("POST", f"{gitea.url}{V4}/{name}", _bearer(task), json.dumps(body).encode())


def _v3(gitea: GiteaDouble, run_id: str | int) -> str:
    return f"{gitea.url}/api/actions_pipeline/_apis/pipelines/workflows/{run_id}/artifacts"


async def test_the_artifact_apis_want_a_running_task_as_bearer(gitea: GiteaDouble) -> None:
    runner, task = await _claim(gitea)
    url = _v3(gitea, task.context["run_id"])
    missing = await _call("GET", url)
    assert (missing.status, missing.content) == (401, b"Bad authorization header\n")
    basic = await _call("GET", url, {"authorization": "Basic " + base64.b64encode(b"x:y").decode()})
    assert basic.status == 401
    assert (await _call("GET", url, {"authorization": "Bearer nonsense"})).content == b"Error runner api getting task\n"
    for headers in (_bearer(task), _bearer(task, jwt=False)):  # the runtime token, or an old runner's task token
        assert (await _call("GET", url, headers)).status == 404  # no artifacts yet
    other = await _call("GET", _v3(gitea, 999), _bearer(task))
    assert (other.status, other.content) == (400, b"run-id does not match\n")
    await runner.update_task(final_state(task.id, Result.SUCCESS), {})
    done = await _call("GET", url, _bearer(task))
    assert (done.status, done.content) == (500, b"Error runner api getting task: task is not running\n")


async def test_v3_chunks_are_checked_and_merged_once_complete(gitea: GiteaDouble) -> None:
    _, task = await _claim(gitea)
    run_id = task.context["run_id"]
    created = await _call("POST", _v3(gitea, run_id), _bearer(task), b'{"type":"actions_storage","name":"logs"}')
    upload = json.loads(created.content)["fileContainerResourceUrl"]
    assert upload == f"{_v3(gitea, run_id)}/{hashlib.md5(b'logs').hexdigest()}/upload"
    data = b"0123456789"

    async def put(start: int, end: int, chunk: bytes, md5: bytes | None = None) -> pyqwest.FullResponse:
        digest = base64.b64encode(md5 or hashlib.md5(chunk).digest()).decode()
        headers = {**_bearer(task), "content-range": f"bytes {start}-{end}/{len(data)}"}
        return await _call(
            "PUT", f"{upload}?itemPath=logs/dir/x.txt", headers | {"x-actions-results-md5": digest}, chunk
        )

    assert (await put(0, 4, data[:5], md5=b"wrong")).status == 500
    assert (await put(5, 9, data[5:])).status == 200
    assert (await put(0, 4, data[:5])).status == 200
    wrong_hash = await _call("PUT", f"{upload}?itemPath=other/x.txt", _bearer(task), b"")
    assert (wrong_hash.status, wrong_hash.content) == (400, b"Invalid artifact hash\n")
    confirm = await _call("PATCH", f"{_v3(gitea, run_id)}?artifactName=logs", _bearer(task), b'{"Size":10}')
    assert confirm.status == 200
    [artifact] = gitea.artifacts(int(run_id))
    assert (artifact.status, artifact.path, gitea.artifact_content(artifact.id)) == (
        "upload_confirmed",
        "dir/x.txt",
        data,
    )
    listing = json.loads((await _call("GET", _v3(gitea, run_id), _bearer(task))).content)
    assert listing["count"] == 1 and listing["value"][0]["name"] == "logs"
    items = json.loads(
        (await _call("GET", listing["value"][0]["fileContainerResourceUrl"] + "?itemPath=logs", _bearer(task))).content
    )
    assert items["value"][0]["path"] == "logs/dir/x.txt"
    content = await _call("GET", items["value"][0]["contentLocation"], _bearer(task))
    assert content.content == data


async def test_v4_upload_finalize_list_download_and_their_refusals(gitea: GiteaDouble) -> None:
    _, task = await _claim(gitea)
    ids = {"workflow_run_backend_id": task.context["run_id"], "workflow_job_run_backend_id": "1"}
    bad = await _rpc(gitea, task, "CreateArtifact", {**ids, "name": "a", "unknown_field": 1})
    assert (bad.status, bad.content) == (500, b"Error decode request body\n")
    wrong_run = await _rpc(gitea, task, "CreateArtifact", {**ids, "workflow_run_backend_id": "0", "name": "a"})
    assert wrong_run.status == 400
    created = json.loads((await _rpc(gitea, task, "CreateArtifact", {**ids, "name": "site", "version": 4})).content)
    assert created["ok"] is True
    upload = created["signedUploadUrl"]
    query = parse_qs(urlsplit(upload).query)
    assert set(query) == {"sig", "expires", "artifactName", "taskID", "artifactID"}
    assert abs(parse_go_time(query["expires"][0]) - (time.time() + 3600)) < 60
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("index.html", "<p>hi</p>")
    data = buffer.getvalue()
    blocks = [(base64.b64encode(b"block-%d" % i).decode(), data[i * 100 : (i + 1) * 100]) for i in range(2)]
    blocks.append((base64.b64encode(b"block-2").decode(), data[200:]))
    for block_id, chunk in reversed(blocks):  # blocks arrive in any order; the list orders them
        put = await _call("PUT", f"{upload}&comp=block&blockid={block_id}", {}, chunk)
        assert (put.status, put.content) == (201, b'"appended"')
    block_list = (
        "<?xml version='1.0'?><BlockList>" + "".join(f"<Latest>{b}</Latest>" for b, _ in blocks) + "</BlockList>"
    )
    assert (await _call("PUT", f"{upload}&comp=blocklist", {}, block_list.encode())).status == 201
    tampered = upload.replace("artifactName=site", "artifactName=other")
    assert (await _call("PUT", f"{tampered}&comp=block&blockid=eA==", {}, b"x")).content == b"Error unauthorized\n"
    mismatch = await _rpc(gitea, task, "FinalizeArtifact", {**ids, "name": "site", "size": str(len(data) + 1)})
    assert (mismatch.status, mismatch.content) == (500, b"Error merge chunks size mismatch\n")
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    for block_id, chunk in blocks:  # the failed finalize consumed the block list only
        await _call("PUT", f"{upload}&comp=block&blockid={block_id}", {}, chunk)
    await _call("PUT", f"{upload}&comp=blocklist", {}, block_list.encode())
    final = json.loads(
        (
            await _rpc(gitea, task, "FinalizeArtifact", {**ids, "name": "site", "size": len(data), "hash": digest})
        ).content
    )
    assert final["ok"] is True and final["artifactId"] == str(
        gitea.artifacts(int(ids["workflow_run_backend_id"]))[0].id
    )
    listed = json.loads((await _rpc(gitea, task, "ListArtifacts", ids)).content)["artifacts"]
    assert [(a["name"], a["size"]) for a in listed] == [("site", str(len(data)))]
    assert json.loads((await _rpc(gitea, task, "ListArtifacts", {**ids, "name_filter": "x"})).content) == {}
    signed = json.loads((await _rpc(gitea, task, "GetSignedArtifactURL", {**ids, "name": "site"})).content)["signedUrl"]
    downloaded = await _call("GET", signed)
    assert downloaded.status == 200 and downloaded.content == data
    assert downloaded.headers["content-type"] == "application/zip"


async def test_v4_signed_urls_expire(gitea: GiteaDouble) -> None:
    _, task = await _claim(gitea)
    expires = go_time(time.time() - 1)
    sig = base64.urlsafe_b64encode(gitea.artifacts_v4.signature("DownloadArtifact", expires, "a", task.id, 1))
    url = (
        f"{gitea.url}{V4}/DownloadArtifact?sig={sig.rstrip(b'=').decode()}&expires={quote_plus(expires)}"
        f"&artifactName=a&taskID={task.id}&artifactID=1"
    )
    expired = await _call("GET", url)
    assert (expired.status, expired.content) == (401, b"Error link expired\n")


@pytest.mark.parametrize("gitea_profile", ["1.24", "1.25"])
async def test_v4_signatures_are_padded_and_checked_strictly_on_1_24_only(
    gitea: GiteaDouble, gitea_profile: str
) -> None:
    """1.24.6 signs with padded base64url and refuses a `sig` without its `=` (which the Azure
    blob client of `@actions/artifact` 2.x drops when it appends `comp=block`); 1.25 on signs
    unpadded. Found against the real releases (tests/peers/test_gitea_artifacts.py)."""
    _, task = await _claim(gitea)
    ids = {"workflow_run_backend_id": task.context["run_id"], "workflow_job_run_backend_id": "1"}
    created = json.loads((await _rpc(gitea, task, "CreateArtifact", {**ids, "name": "site", "version": 4})).content)
    upload = created["signedUploadUrl"]
    sig = parse_qs(urlsplit(upload).query)["sig"][0]
    padded = gitea_profile == "1.24"
    assert sig.endswith("=") is padded and len(sig) == (44 if padded else 43)
    stripped = upload.replace(f"sig={sig}", f"sig={sig.rstrip('=')}")
    escaped = upload.replace(f"sig={sig}", f"sig={sig.replace('=', '%3D')}")
    block = f"&comp=block&blockid={base64.b64encode(b'b0').decode()}"
    refused = await _call("PUT", f"{stripped}{block}", {}, b"x")
    assert (refused.status, refused.content) == ((401, b"Error unauthorized\n") if padded else (201, b'"appended"'))
    assert (await _call("PUT", f"{escaped}{block}", {}, b"x")).status == 201  # the `=` sent escaped


def test_go_time_round_trips() -> None:
    now = time.time()
    text = go_time(now)
    assert text.endswith(" +0000 UTC") and abs(parse_go_time(text) - now) < 1e-5
    assert go_time(0) == "1970-01-01 00:00:00 +0000 UTC"


async def test_artifact_item_paths_cannot_climb_out(gitea: GiteaDouble) -> None:
    """As Gitea's v3 upload: the item path is cleaned as if rooted (PathJoinRelX: `..` and
    backslashes cannot leave the artifact), its first segment is the name, which must match
    the upload URL's hash and hold no forbidden character."""
    _, task = await _claim(gitea)
    run_id = task.context["run_id"]
    data = b"climb"
    headers = {
        **_bearer(task),
        "content-range": f"bytes 0-{len(data) - 1}/{len(data)}",
        "x-actions-results-md5": base64.b64encode(hashlib.md5(data).digest()).decode(),
    }

    async def upload(name: str, item_path: str) -> pyqwest.FullResponse:
        body = json.dumps({"type": "actions_storage", "name": name}).encode()
        created = await _call("POST", _v3(gitea, run_id), _bearer(task), body)
        url = json.loads(created.content)["fileContainerResourceUrl"]
        return await _call("PUT", f"{url}?itemPath={quote_plus(item_path)}", headers, data)

    refused = await upload("../logs", "../logs/x.txt")  # cleaned to logs/x.txt: not the URL's artifact
    assert (refused.status, refused.content) == (400, b"Invalid artifact hash\n")
    forbidden = await upload("a:b", "a:b/x.txt")
    assert forbidden.status == 400 and b"invalid character" in forbidden.content
    climbing = await upload("logs", "logs/../../../../etc/x.txt")  # cleaned to etc/x.txt: another name
    assert (climbing.status, climbing.content) == (400, b"Invalid artifact hash\n")
    assert (await upload("logs", "logs/dir/..\\..\\logs\\x.txt")).status == 200
    assert (await _call("PATCH", f"{_v3(gitea, run_id)}?artifactName=logs", _bearer(task), b'{"Size":5}')).status == 200
    [artifact] = gitea.artifacts(int(run_id))
    assert (artifact.name, artifact.path) == ("logs", "x.txt")
