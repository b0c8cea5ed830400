"""The runner registration token, and what the controller does when Gitea refuses it.

Gitea refuses a registration token it does not know, one replaced by a newer one (creating
a token in Gitea's runner settings invalidates the older ones of that scope) and one whose
owner or repository is gone. Registering again with the same token can never succeed, so a
refusal is not retried: the claim loops stop registering, the controller says so in one
error line naming the fix and in `/readyz`, and keeps doing what needs no new runner —
claiming with runners it armed before, launching queued assignments, reaping. It does not
exit: a crash loop would stop the reaping and bury the one line that says why under restarts.

A token read from `registrationTokenFile` is read again every `RECHECK_S` while refused;
claiming resumes with the first different token (a Kubernetes Secret updated in place, or an
admin writing the file), without a restart. A token given inline (config or
`DYNRUNNER_GITEA_REGISTRATION_TOKEN`) is fixed for the process: that needs a restart.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from dynrunner.controller.config.model import GiteaConfig
from dynrunner.proto.gitea import RegistrationRefused

log = logging.getLogger(__name__)

RECHECK_S = 10.0
WHERE_TO_GET_ONE = (
    "Gitea: Site Administration, or an organization's or repository's Settings → Actions → Runners → Create new runner"
)


class RegistrationToken:
    """The current token (shared by every claim loop), and Gitea's refusal of it, if any."""

    def __init__(self, value: str, file: Path | None = None, *, recheck_s: float = RECHECK_S) -> None:
        self._value = value
        self.file = file
        self.recheck_s = recheck_s
        self._refused: str | None = None
        """The token Gitea refused, while it is still the current one."""
        self._reason = ""
        self._changed = asyncio.Event()

    @classmethod
    def from_config(cls, gitea: GiteaConfig) -> RegistrationToken:
        return cls(gitea.registration_token(), gitea.registration_token_file, recheck_s=RECHECK_S)

    @property
    def value(self) -> str:
        return self._value

    @property
    def refusal(self) -> str | None:
        """Why the current token cannot register runners (for /readyz), or None."""
        if self._refused is None:
            return None
        return f"Gitea refused the registration token ({self._reason}); {self.fix}"

    @property
    def fix(self) -> str:
        if self.file is not None:
            return f"put a valid one ({WHERE_TO_GET_ONE}) into {self.file}; it is read again every {self.recheck_s:g} s"
        return (
            f"set a valid one ({WHERE_TO_GET_ONE}) as gitea.registrationToken or "
            "DYNRUNNER_GITEA_REGISTRATION_TOKEN and restart the controller"
        )

    def refused(self, token: str, err: RegistrationRefused) -> None:
        """Register refused `token`; said once per token, however many loops met it."""
        if token != self._value or self._refused == token:
            return
        self._refused, self._reason = token, err.message
        self._changed.clear()
        log.error(
            "%s. Claiming new jobs has stopped until then; running jobs, queued assignments and reaping go on",
            self.refusal,
        )

    async def replaced(self) -> None:
        """Return once the refused token was replaced by another (never for an inline one)."""
        while self._refused is not None:
            if self.file is None:
                await self._changed.wait()
                continue
            try:
                text = self.file.read_text(encoding="utf-8")  # a few bytes: read on the loop
            except (OSError, UnicodeDecodeError) as err:
                log.debug("registration token file %s cannot be read again: %s", self.file, err)
                text = ""
            text = text.strip()
            if text and text != self._refused:
                self._value, self._refused = text, None
                self._changed.set()
                log.info("the registration token in %s changed; claiming again", self.file)
                return
            try:
                await asyncio.wait_for(self._changed.wait(), self.recheck_s)
            except TimeoutError:
                pass
