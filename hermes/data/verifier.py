"""A task folder's verifier (Harbor's tests/test.sh), run in the prompt's sandbox after the agent.

Only then do the tests reach the sandbox: tests/ is copied to /tests, any reward file the agent
left is removed, and `bash /tests/test.sh` runs in the image's WORKDIR within the verifier's time
limit. It writes /logs/verifier/reward.txt (a number) or reward.json ({"reward": n, more metrics});
that number is the entry's reward (`value`; `passed` when it is 1 or more), the other metrics kept
beside it. No reward file is a failed check with that reason; a verifier that could not reach the
network it needed (the run gives it none unless --verifier_network) says so.

With --verifier_network and an agent without the network, test.sh runs in a copy of the agent's
sandbox that has it (the backend's networked_copy: the agent's files, none of its processes), so
nothing the agent started ever gets the network through this flag.
"""
from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from hermes.data.entry import Reward
from hermes.sandbox import Sandbox, SandboxError

TESTS_AT = "/tests"
LOGS = "/logs/verifier"
REWARD_TXT, REWARD_JSON = f"{LOGS}/reward.txt", f"{LOGS}/reward.json"
#: characters of the verifier's output kept in the reward (its end)
OUTPUT = 4000
#: what a command that wanted the network and had none prints (curl, pip, apt, uv, Python's socket)
_NO_NETWORK = re.compile(
    r"could not resolve host|temporary failure in name resolution|name or service not known|network is unreachable"
    r"|failed to establish a new connection|no address associated with hostname|failed to fetch|"
    r"dns error|connection refused.*(pypi|github|astral)|getaddrinfo", re.I)


def copy_folder(box: Sandbox, folder: str | Path, to: str) -> int:
    """Place a host folder's files in the sandbox under `to`; how many."""
    root = Path(folder)
    n = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        box.write_file(posixpath.join(to, path.relative_to(root).as_posix()), path.read_bytes())
        n += 1
    return n


def make_logs(box: Sandbox) -> None:
    """/logs/verifier (and /logs/agent) present and writable, as Harbor's tasks expect."""
    res = box.exec(f"mkdir -p {LOGS} /logs/agent && chmod 777 /logs/agent {LOGS}", timeout=30)
    if res.exit_code != 0:
        raise SandboxError(f"cannot make {LOGS} in the task's sandbox (its user cannot write /logs): "
                           f"{res.output.strip()[-500:]}")


@dataclass(frozen=True)
class Verifier:
    tests: str            # the task's tests/ on the host
    timeout: float        # seconds test.sh may take
    network: bool = False  # does the sandbox have a network for it
    #: the agent had none: run test.sh in a networked copy of its sandbox (--verifier_network)
    own_network: bool = False

    def judge(self, box: Sandbox) -> Reward:
        if not self.own_network:
            return self._judge(box)
        try:
            copy = box.networked_copy()  # type: ignore[attr-defined]
        except (AttributeError, OSError, SandboxError) as e:
            return _unrun(f"the verifier could not be given the network (--verifier_network): {e}")
        try:
            return self._judge(copy)
        finally:
            try:
                copy.close()
            except SandboxError:
                pass  # its container is the run's (its cleanup sweeps it); a stray image is named hermes-verifier

    def _judge(self, box: Sandbox) -> Reward:
        try:
            copy_folder(box, self.tests, TESTS_AT)
            box.exec(f"chmod -R a+rX {TESTS_AT}; rm -f {REWARD_TXT} {REWARD_JSON}; mkdir -p {LOGS}", timeout=30)
            res = box.exec(f"bash {TESTS_AT}/test.sh", timeout=self.timeout)
        except (OSError, SandboxError) as e:
            return _unrun(f"the verifier could not run: {e}")
        output = res.output if len(res.output) <= OUTPUT else "[...]" + res.output[-OUTPUT:]
        value, metrics, reason = read_reward(box)
        if res.timed_out:
            reason = f"the verifier did not finish within its {self.timeout:g}s"
        passed = value is not None and value >= 1 and not res.timed_out
        if not passed and not res.timed_out and not self.network and _NO_NETWORK.search(res.output):
            # a test.sh that writes 0 when its tests failed to fetch something fails for the same reason
            reason = ("the verifier needs the network, and its sandbox has none: run with --verifier_network "
                      f"to allow it ({reason or _why(value, res.exit_code)})")
        return Reward(passed=passed, exit_code=res.exit_code, output=output, truncated=len(output) < len(res.output)
                      or res.truncated, timed_out=res.timed_out, duration=round(res.duration, 3),
                      value=value, metrics=metrics, reason=None if passed else reason or _why(value, res.exit_code))


def _unrun(reason: str) -> Reward:
    return Reward(passed=False, exit_code=-1, output="", truncated=False, timed_out=False, duration=0.0,
                  reason=reason[:OUTPUT])


def _why(value: float | None, code: int) -> str:
    return f"the verifier's reward is {value:g}" if value is not None else f"test.sh exited {code}"


def read_reward(box: Sandbox) -> tuple[float | None, dict | None, str | None]:
    """(the reward, reward.json's other metrics, why there is none) as the verifier left them."""
    try:
        text = box.read_file(REWARD_TXT).decode("utf-8", "replace").strip()
    except FileNotFoundError:
        text = None
    except SandboxError as e:
        return None, None, f"cannot read {REWARD_TXT}: {e}"
    if text is not None:
        try:
            value = float(text)
        except ValueError:
            return None, None, f"{REWARD_TXT} is not a number: {text[:100]!r}"
        return (value, None, None) if math.isfinite(value) else (None, None, f"{REWARD_TXT} is {text!r}")
    try:
        data = json.loads(box.read_file(REWARD_JSON))
    except FileNotFoundError:
        return None, None, f"the verifier wrote no {REWARD_TXT} or {REWARD_JSON}"
    except (ValueError, SandboxError) as e:
        return None, None, f"cannot read {REWARD_JSON}: {e}"
    value = data.get("reward") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None, None, f"{REWARD_JSON} has no numeric 'reward': {json.dumps(data)[:200]}"
    return float(value), {k: v for k, v in data.items() if k != "reward"}, None
