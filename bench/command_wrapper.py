"""The exec wrapper's own cost per command, before and after issue 45's change, side by side.

    python -m bench.command_wrapper [--calls 200] [--rounds 6] [--image hermes-sandbox:bookworm]

Before: the command ran as a background job of the wrapper (`setsid sh -c "$c" &`), which left
SIGINT and SIGQUIT ignored. After: it runs in the foreground of a pipeline (channel.WRAPPER),
one more fork and exec a command. Two measures, both inside one container of the image:

* in-container: a shell loop runs the wrapper around `true` `calls` times; `times` gives the
  CPU its children used, the clock the wall time. Rounds alternate before/after, so the
  machine's other load hits both alike.
* end to end: `sandbox.exec("true")` through the command channel of two docker sandboxes, one
  opened with each wrapper, calls alternating between them: what a tool call costs.

Medians are reported, and the after/before differences. The machine is shared: compare the two
columns of one run, not numbers across runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

from hermes.sandbox import SandboxSettings, SandboxSpec, get_backend
from hermes.sandbox.docker import channel

#: channel.WRAPPER before issue 45 (commit 132f427): the command as a background job
OLD_WRAPPER = r"""exec 3>&2 2>&1
n=$1 t=$2 d=$3 c=$4
cd -- "$d" 2>/dev/null || { mkdir -p -- "$d" 2>/dev/null; cd -- "$d"; } || { printf '\n%s 126 1\n' "$n"; exit 126; }
if command -v setsid >/dev/null 2>&1; then
  setsid sh -c "$c" </dev/null 3>&- &
  p=$!
  echo "$n pgid $p" >&3
  setsid sh -c 'sleep "$1" && kill -9 -"$2"' hermes-timer "$t" "$p" </dev/null >/dev/null 2>&1 3>&- &
  w=$!
  { wait "$p"; } 2>/dev/null; r=$?
  kill -9 "$w" -"$w" 2>/dev/null
else
  sh -c "$c" </dev/null 3>&- &
  p=$!
  echo "$n pid $p" >&3
  ( sleep "$t" && kill -9 "$p" ) </dev/null >/dev/null 2>&1 3>&- &
  w=$!
  { wait "$p"; } 2>/dev/null; r=$?
  kill -9 "$w" 2>/dev/null
fi
{ wait "$w"; } 2>/dev/null; f=$?
printf '\n%s %s %s\n' "$n" "$r" "$f"
"""
NEW_WRAPPER = channel.WRAPPER

# $1 the wrapper, $2 calls: wall nanoseconds, then `times` (the loop's and its children's CPU)
LOOP = r"""W=$1 N=$2 i=0
s=$(date +%s%N)
while [ "$i" -lt "$N" ]; do sh -c "$W" hermes-exec n 30 /tmp true >/dev/null 2>&1; i=$((i + 1)); done
e=$(date +%s%N)
echo "$((e - s))"
times
"""
RUN = f"bench-wrapper-{uuid.uuid4().hex[:6]}"


def _seconds(word: str) -> float:
    """`times`' 0m0.012s (dash) as seconds."""
    m, _, s = word.rstrip("s").partition("m")
    return float(m) * 60 + float(s)


def in_container(sb, wrapper: str, calls: int) -> tuple[float, float]:
    """(wall ms, CPU ms) per wrapped `true`, from one loop of `calls`."""
    r = sb.exec(f"sh -c {_quote(LOOP)} loop {_quote(wrapper)} {calls}", timeout=600)
    lines = r.output.split("\n")
    wall_ns = int(lines[0])
    child_user, child_sys = lines[2].split()  # second `times` line: the children's user and system time
    cpu = _seconds(child_user) + _seconds(child_sys)
    return wall_ns / 1e6 / calls, cpu * 1000 / calls


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--exec-calls", type=int, default=100)
    ap.add_argument("--image", default="hermes-sandbox:bookworm")
    a = ap.parse_args()
    backend = get_backend(SandboxSettings(command_timeout=600, output_limit=100_000))
    found: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": [], "exec": []} for k in ("before", "after")}
    sb = backend.open(SandboxSpec(image=a.image, run_id=RUN, prompt_id="loop"))
    try:
        for i in range(a.rounds):
            for name, wrapper in (("before", OLD_WRAPPER), ("after", NEW_WRAPPER))[:: 1 if i % 2 == 0 else -1]:
                wall, cpu = in_container(sb, wrapper, a.calls)
                found[name]["wall"].append(wall)
                found[name]["cpu"].append(cpu)
    finally:
        sb.close()
    boxes = {}
    for name, wrapper in (("before", OLD_WRAPPER), ("after", NEW_WRAPPER)):
        channel.WRAPPER = wrapper  # the channel's script is made of it when the sandbox opens
        boxes[name] = backend.open(SandboxSpec(image=a.image, run_id=RUN, prompt_id=name))
        boxes[name].exec("true")
    channel.WRAPPER = NEW_WRAPPER
    try:
        for i in range(a.exec_calls):
            for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
                t0 = time.perf_counter()
                r = boxes[name].exec("true")
                found[name]["exec"].append((time.perf_counter() - t0) * 1000)
                assert r.exit_code == 0, r
    finally:
        for sb in boxes.values():
            sb.close()
    med = {n: {k: statistics.median(v) for k, v in m.items()} for n, m in found.items()}
    print(f"{'per command (median)':34} {'before':>9} {'after':>9} {'after-before':>13}")
    for key, what in (("cpu", "in-container CPU ms (sh + children)"), ("wall", "in-container wall ms"),
                      ("exec", "sandbox.exec('true') wall ms")):
        b, f = med["before"][key], med["after"][key]
        print(f"{what:34} {b:9.3f} {f:9.3f} {f - b:+13.3f}")
    print(json.dumps({"image": a.image, "calls": a.calls, "rounds": a.rounds, "exec_calls": a.exec_calls,
                      "median": med, "raw": found}))


if __name__ == "__main__":
    main()
