"""Scripts that pass or fail per conversation: a model with a known chance of solving a task.

    MOCK_SCRIPT: {"pass": {"turns": [...]}, "fail": {"turns": [...]}, "pass_chance": 0.5, "pass_on": [2, 3]}

Attempts of one task share their instruction, so a plain script answers them all alike; a branched
script picks one branch per conversation, once, at its first assistant turn:

* ``pass_on``: the nth conversation the server sees opening with this same user message (n from 1,
  counted at first turns) takes the ``pass`` branch when n is listed. Deterministic where attempts
  start one after another (an attempt parallelism of 1).
* ``pass_chance`` p: a draw u in [0, 1) from the request's ``seed`` (hermes sends one per attempt
  with ``--sampling_seed S``: the attempts of a task draw independently, and a rerun draws the same)
  and the script's token; without a seed, from the visit number n instead. ``pass`` when u < p.
* Both: ``pass`` when either says so. Neither is a 400.

The seed changes every turn, so the first turn's choice must travel: a branched script's tool call
ids say it, ``call_<k>P_<n>_<i>`` (pass) or ``call_<k>F_<n>_<i>`` (fail), and a later turn reads it
back from the first assistant message of the conversation. The server keeps no memory of it (a
restarted mock still continues a conversation on its branch). A later turn with no such id (the
first turn called no tool, or ``--tool-calls`` wrote the calls as text and the client named them)
takes the ``fail`` branch. A first turn asked again (a retried error) counts as a new visit.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

from mockllm.conversation import BadRequest, Conversation

PASS, FAIL = "pass", "fail"
_MARK = {PASS: "P", FAIL: "F"}


def is_branched(script: dict) -> bool:
    return "pass" in script or "fail" in script


def check_branched(script: dict, check_turn) -> None:
    """Raise BadRequest unless ``script`` is a well-formed branched script (check_turn checks a turn)."""
    for name in (PASS, FAIL):
        branch = script.get(name)
        if not isinstance(branch, dict) or not isinstance(branch.get("turns"), list):
            raise BadRequest(f'MOCK_SCRIPT {name} must be an object {{"turns": [...]}}')
        for i, turn in enumerate(branch["turns"]):
            check_turn(i, turn)
    chance = script.get("pass_chance")
    if chance is not None and (isinstance(chance, bool) or not isinstance(chance, (int, float)) or not 0 <= chance <= 1):
        raise BadRequest("MOCK_SCRIPT pass_chance must be a number between 0 and 1")
    on = script.get("pass_on")
    if on is not None and not (isinstance(on, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                                            for n in on)):
        raise BadRequest("MOCK_SCRIPT pass_on must be a list of conversation numbers (1, 2, ...)")
    if chance is None and on is None:
        raise BadRequest("a MOCK_SCRIPT with pass and fail branches needs pass_chance or pass_on")


def draw(token: str, source: Any) -> float:
    """A uniform number in [0, 1) from the script's token and a seed (or visit number): stable everywhere."""
    digest = hashlib.blake2b(f"{token}\0{source}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def choose(script: dict, conv: Conversation) -> str:
    """The branch of a conversation at its first turn (counts the visit)."""
    visit = conv.visits(conv.first_user) if conv.visits is not None else 1
    if visit in (script.get("pass_on") or ()):
        return PASS
    chance = float(script.get("pass_chance") or 0)
    source = f"seed {conv.seed}" if conv.seed is not None else f"visit {visit}"
    return PASS if draw(conv.token, source) < chance else FAIL


def carried(conv: Conversation) -> str:
    """The branch a later turn continues: read from the first assistant message's tool call ids."""
    mark = re.compile(rf"^call_{re.escape(conv.token)}([PF])_")
    for message in conv.messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            found = mark.match(str(call.get("id", ""))) if isinstance(call, dict) else None
            if found:
                return PASS if found.group(1) == "P" else FAIL
    return FAIL


def branch_of(script: dict, conv: Conversation) -> tuple[dict, str]:
    """(the branch's script, the mark its tool call ids carry)."""
    name = choose(script, conv) if conv.assistant_turns == 0 else carried(conv)
    return script[name], _MARK[name]
