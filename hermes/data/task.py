"""A row's own work in its sandbox, around the agent: setup before it, the check after it.

    files   {path: text} placed first (relative paths under the row's cwd)
    setup   a command or a list of commands, run in order under one time limit; the first one
            that fails (or runs out of time) fails the prompt, its output the reason
    check   one command run in the same sandbox once the agent has finished, before the
            container goes: its exit code and (bounded) output are the entry's `reward`

None of it is shown to the model or kept in the trajectory: the model sees only the result
(the files are there; the tests pass or not).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from hermes.data.dataset import PromptRow
from hermes.data.entry import Reward
from hermes.data.verifier import Verifier, make_logs
from hermes.sandbox import Sandbox, SandboxError

#: characters of a failing setup command's output kept in the prompt's error
SETUP_OUTPUT = 2000
#: characters of a check's output kept in the reward (its end: where test runners sum up)
CHECK_OUTPUT = 4000


class SetupFailed(SandboxError):
    """The row's setup did not complete: the prompt fails with this as its reason."""

    kind = "row setup failed"
    transient = False


def _tail(text: str, limit: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else ("[...]" + text[-limit:], True)


@dataclass(frozen=True)
class RowTask:
    """What a row asks of its sandbox besides the agent, with the run's time limits."""

    files: dict[str, str]
    setup: list[str]
    check: str | None
    setup_timeout: float
    check_timeout: float
    #: a task folder's tests (hermes.data.verifier), in place of `check`
    verifier: Verifier | None = None

    @classmethod
    def of(cls, row: PromptRow, setup_timeout: float, check_timeout: float,
           verifier: Verifier | None = None) -> "RowTask | None":
        if not row.has_task:
            return None
        return cls(dict(row.files or {}), row.setup_commands, row.check, setup_timeout, check_timeout, verifier)

    @property
    def prepare(self) -> Callable[[Sandbox], None] | None:
        return self._prepare if self.files or self.setup or self.verifier else None

    @property
    def judge(self) -> Callable[[Sandbox], Reward] | None:
        if self.verifier is not None:
            return self.verifier.judge
        return self._judge if self.check else None

    def _prepare(self, box: Sandbox) -> None:
        deadline = time.monotonic() + self.setup_timeout
        if self.verifier is not None:
            try:
                make_logs(box)
            except SandboxError as e:
                raise SetupFailed(f"setup: {e}") from e
        for path, text in self.files.items():
            try:
                box.write_file(path, text.encode("utf-8"))
            except (OSError, SandboxError) as e:
                raise SetupFailed(f"setup: could not place file {path}: {e}") from e
        for n, command in enumerate(self.setup, start=1):
            left = deadline - time.monotonic()
            which = f"setup command {n}/{len(self.setup)}"
            if left <= 0:
                raise SetupFailed(f"{which} not started: setup ran out of its {self.setup_timeout:g}s (--setup_timeout)")
            res = box.exec(command, timeout=left)
            said, _ = _tail(res.output.strip(), SETUP_OUTPUT)
            if res.timed_out:
                raise SetupFailed(f"{which} did not finish within setup's {self.setup_timeout:g}s (--setup_timeout): "
                                  f"{command}\n{said}".rstrip())
            if res.exit_code != 0:
                raise SetupFailed(f"{which} failed (exit {res.exit_code}): {command}\n{said}".rstrip())

    def _judge(self, box: Sandbox) -> Reward:
        try:
            res = box.exec(self.check, timeout=self.check_timeout)
        except SandboxError as e:  # the agent left no usable sandbox (e.g. it filled the memory): a failed check
            return Reward(passed=False, exit_code=-1, output=f"the check could not run: {e}"[:CHECK_OUTPUT],
                          truncated=False, timed_out=False, duration=0.0)
        output, cut = _tail(res.output, CHECK_OUTPUT)
        return Reward(passed=res.exit_code == 0 and not res.timed_out, exit_code=res.exit_code, output=output,
                      truncated=cut or res.truncated, timed_out=res.timed_out, duration=round(res.duration, 3))
