"""`uses:` actions: finding an action, reading its metadata, running its kind.

`Actions.load` turns a step's `uses:` into a `LoadedAction` (local `./path` from the
workspace, `owner/repo@ref` from Gitea's default actions instance or a full URL, fetched
once per job; `docker://`); the engine then binds its inputs (`ActionCall`) and runs the
handler of its kind — composite, node, or docker, which needs a container runtime this
executor does not drive — for the stage at hand (`pre`, `main`, `post`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dynrunner.executor.actions.manifest import METADATA_NAMES, Manifest, ManifestError, read_manifest
from dynrunner.executor.actions.nodejs import NodeRuntime
from dynrunner.executor.actions.reference import (
    DockerAction,
    LocalAction,
    Reference,
    ReferenceError,
    RemoteAction,
    parse_uses,
)
from dynrunner.executor.actions.store import ActionStore, Fetched, FetchError
from dynrunner.executor.actions.toolkit import needs_patch, patch_action
from dynrunner.executor.scope import ActionInfo


class ActionError(RuntimeError):
    """The action cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class LoadedAction:
    reference: Reference
    directory: Path | None
    """The action's own directory (None for a `docker://` image)."""
    manifest: Manifest | None
    repository: str = ""
    ref: str = ""

    @property
    def display(self) -> str:
        return str(self.reference)

    @property
    def kind(self) -> str:
        return "docker" if self.manifest is None else self.manifest.kind

    @property
    def remote(self) -> bool:
        return isinstance(self.reference, RemoteAction)


@dataclass(frozen=True, slots=True)
class ActionCall:
    """A loaded action bound to one step's inputs: what its stages run with."""

    action: LoadedAction
    inputs: dict[str, str] = field(default_factory=dict)
    node: NodeRuntime | None = None

    @property
    def display(self) -> str:
        return self.action.display

    @property
    def manifest(self) -> Manifest | None:
        return self.action.manifest

    @property
    def directory(self) -> Path | None:
        return self.action.directory

    @property
    def repository(self) -> str:
        return self.action.repository

    @property
    def ref(self) -> str:
        return self.action.ref

    def info(self) -> ActionInfo:
        return ActionInfo(path=str(self.directory or ""), repository=self.repository, ref=self.ref)

    def action_vars(self) -> dict[str, str]:
        return self.info().variables()


class Actions:
    """The job's way to actions: where `owner/repo@ref` lives, the fetched ones, Node."""

    def __init__(
        self,
        *,
        store: ActionStore,
        workspace: Path,
        default_actions_url: str,
        gitea_urls: tuple[str, ...],
        node: NodeRuntime,
    ) -> None:
        self.store = store
        self.workspace = workspace
        self.default_actions_url = default_actions_url
        self.gitea_urls = gitea_urls
        self.node = node
        self._opened_dirs: dict[Path, Path] = {}

    def parse(self, uses: str) -> Reference:
        try:
            return parse_uses(uses, default_actions_url=self.default_actions_url, gitea_urls=self.gitea_urls)
        except ReferenceError as err:
            raise ActionError(str(err)) from None

    async def load(self, uses: str, log: Callable[[str], None]) -> LoadedAction:
        """Find and read the action `uses` names; raises ActionError."""
        reference = self.parse(uses)
        if isinstance(reference, DockerAction):
            return LoadedAction(reference, None, None)
        try:
            if isinstance(reference, LocalAction):
                directory = _normalised(self.workspace / reference.path)
                if not _holds_action(directory):
                    raise ActionError(
                        f"Can't find 'action.yml', 'action.yaml' or 'Dockerfile' under '{directory}'. "
                        "Did you forget to run actions/checkout before running your local action?"
                    )
                return LoadedAction(reference, directory, read_manifest(directory, f"action {reference}: "))
            fetched = await self.store.get(reference, log)
            directory = fetched.directory / reference.path if reference.path else fetched.directory
            manifest = read_manifest(directory, f"action {reference}: ")
            directory = await self._opened(directory, manifest, fetched, reference)
        except (FetchError, ManifestError, OSError) as err:
            raise ActionError(str(err)) from None
        return LoadedAction(reference, directory, manifest, reference.repository, reference.ref)

    async def _opened(self, directory: Path, manifest: Manifest, fetched: Fetched, reference: RemoteAction) -> Path:
        """The directory to run a fetched JavaScript action from, its bundles' toolkit gates open
        (`toolkit`): patched in place once per job, or, for an action of the read-only seeded
        cache that needs it, in a copy of its repository in the job's actions directory."""
        if manifest.kind != "node":
            return directory
        done = self._opened_dirs.get(directory)
        if done is not None:
            return done
        if not fetched.seeded:
            await asyncio.to_thread(patch_action, directory, manifest)
            opened = directory
        elif await asyncio.to_thread(needs_patch, directory, manifest):
            copy = self.store.root / f"seeded-{len(self._opened_dirs)}-{reference.owner}-{reference.repo}"
            await asyncio.to_thread(shutil.copytree, fetched.directory, copy, symlinks=True, dirs_exist_ok=True)
            opened = copy / reference.path if reference.path else copy
            await asyncio.to_thread(patch_action, opened, manifest)
        else:
            opened = directory
        self._opened_dirs[directory] = opened
        return opened


def _normalised(path: Path) -> Path:
    """Without `.` and `..` components, as GITHUB_ACTION_PATH shows a local action's directory."""
    return Path(os.path.normpath(path))


def _holds_action(directory: Path) -> bool:
    return any((directory / name).is_file() for name in (*METADATA_NAMES, "Dockerfile"))


__all__ = ["ActionCall", "ActionError", "Actions", "LoadedAction", "NodeRuntime"]
