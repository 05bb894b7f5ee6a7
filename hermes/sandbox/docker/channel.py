"""The exec wrapper and the command channel: the shell texts run in a sandbox, the reader of
the engine's exec stream, and the open channel exec.

Commands run as `sh -c` under a small POSIX-sh wrapper that starts the command in a
session of its own (`setsid`) next to a timer that kills that whole process group at the
time limit; the host also bounds its wait. The command's stdout and stderr come merged, in
order. The wrapper prints an end marker after the command, so a command that leaves a
background process holding its output returns at once instead of waiting for the engine's
I/O grace period.

A sandbox's one exec is a command channel (see SERVER): a small `sh` loop taking framed
requests (run a command under the wrapper above, read a file, write a file) on its stdin, so
a tool call costs no engine round trip; a call that cannot have it gets an exec of its own
(the same texts, run directly), as all calls once did.
"""
from __future__ import annotations

import socket
import struct
import time
from typing import Any, Callable

from hermes.sandbox.base import SandboxError

# --------------------------------------------------------------------------- the exec wrapper

# $1 nonce, $2 seconds, $3 cwd, $4 command. fd 3 is the control channel (the exec's stderr);
# the command's stdout and stderr both go to the exec's stdout (fd 4 keeps it), in order.
# The command runs in the foreground of a pipeline, never as a background job (`cmd &`): a
# non-interactive shell starts its background jobs with SIGINT and SIGQUIT ignored (POSIX), and
# that is inherited through exec, so Ctrl-C-style handling (KeyboardInterrupt, `timeout -s INT`,
# a server's graceful stop) never worked in a sandbox. The left side starts the command in a
# session of its own (`setsid`, its process group is what the time limit kills), whose first
# shell says its pid into the pipe and then becomes the command; the left side then sends the
# command's exit status (its shell's "Killed" notices go nowhere, as under `docker exec`). The
# right side reads the pid, tags it on fd 3, runs the timer (in a session of its own: a
# command's `kill 0` cannot reach it), and ends the timer once the status came. A left side
# killed before it could send the status (a command's `kill -9 $PPID`) leaves the command
# without its reporter: the right side kills it, and says so (137), as the time limit would.
WRAPPER = r"""exec 3>&2 2>&1 4>&1
n=$1 t=$2 d=$3 c=$4
cd -- "$d" 2>/dev/null || { mkdir -p -- "$d" 2>/dev/null; cd -- "$d"; } || { printf '\n%s 126 1\n' "$n"; exit 126; }
unset OLDPWD  # cd set and exported it: a command under `docker exec` has none
S=; command -v setsid >/dev/null 2>&1 && S=setsid
{ $S sh -c 'echo "$$"; exec sh -c "$1" >&4 2>&4 4>&-' sh "$c" </dev/null 3>&-; echo "$?"; } 2>/dev/null |
{ read -r p
  if [ -n "$S" ]; then
    k=-$p; echo "$n pgid $p" >&3
    setsid sh -c 'sleep "$1" && kill -9 "$2"' hermes-timer "$t" "$k" </dev/null >/dev/null 2>&1 3>&- 4>&- &
  else
    k=$p; echo "$n pid $p" >&3
    ( sleep "$t" && kill -9 "$k" ) </dev/null >/dev/null 2>&1 3>&- 4>&- &
  fi
  w=$!
  read -r r || { kill -9 "$k" 2>/dev/null; r=137; }
  kill -9 "$w" -"$w" 2>/dev/null
  { wait "$w"; } 2>/dev/null; f=$?
  printf '\n%s %s %s\n' "$n" "${r:-1}" "$f"
}
"""

# $1 cwd, $2 path: enter cwd, then say why the file cannot be read (exit 3/4/5) or return 0.
READ_CHECKS = r"""cd -- "$1" 2>/dev/null || { mkdir -p -- "$1" 2>/dev/null && cd -- "$1"; } || cd /
[ -e "$2" ] || { echo "No such file or directory: $2" >&2; exit 3; }
[ -d "$2" ] && { echo "Is a directory: $2" >&2; exit 4; }
[ -r "$2" ] || { echo "Permission denied: $2" >&2; exit 5; }
"""
READ = READ_CHECKS + 'exec cat -- "$2"\n'

WRITE = r"""cd -- "$1" 2>/dev/null || { mkdir -p -- "$1" 2>/dev/null && cd -- "$1"; } || cd /
p=$2
if [ -d "$p" ]; then cat >/dev/null; echo "Is a directory: $p" >&2; exit 4; fi
d=$(dirname -- "$p")
if ! { [ -d "$d" ] || mkdir -p -- "$d"; } 2>&1 >&2; then cat >/dev/null; exit 5; fi
if ! cat > "$p"; then cat >/dev/null; exit 5; fi
"""


# The command channel: one `sh` per container, started once, serving every later command and
# file operation of the sandbox over its exec's stdin/stdout/stderr, so a tool call costs no
# engine round trip. Its text comes over stdin (see server_text: in argv it would fill every
# `ps` listing), set up with W the exec wrapper, R the read checks, V the write script (the
# texts the per-call path runs); it says "~hermes-channel PID" on stderr when it listens.
# A request is a header line and two argument lines. An argument is one shell word the shell
# takes in with `eval` (see word: single-quoted pieces joined by "$NL"), so no byte of a command
# or path can end a line or leave its quotes, and decoding starts no process (base64 in a
# command substitution cost two forks and an exec an argument: 0.75 ms of CPU, measured):
#   NONCE x SECONDS + CWD, COMMAND  run a command: "\nNONCE s\n", then the wrapper's own output
#                                   and end marker, on stdout (the command's stdout and stderr)
#   NONCE r + CWD, PATH             read a file       } answered on stderr, which no command holds:
#   NONCE w SIZE + CWD, PATH        write a file: SIZE } "~NONCE\n", the payload (base64 of the file,
#                                   raw bytes follow   }  or the error), "\n~NONCE CODE\n"
#   NONCE p + "hermes", "a'b\n"     ping: does this shell decode requests, and has it head and base64?
# The nonce is fresh per request and lives only in this shell's memory (not in any argv or
# environment a command can read), so output can neither fake an answer nor end one early.
# Commands get /dev/null as stdin: the request stream is this shell's alone. A wrapper killed
# from inside (kill $PPID) still gets an end marker, from here.
SERVER = r"""printf '~hermes-channel %s\n' "$$" >&2
NL='
'
while IFS=' ' read -r n o a; do
  IFS= read -r b && IFS= read -r c || break
  eval "d=$b; e=$c"
  case $o in
  x) printf '\n%s s\n' "$n"
     ( set -- "$n" "$a" "$d" "$e"; eval "$W" ) </dev/null
     s=$?; [ "$s" = 0 ] || [ "$s" = 126 ] || printf '\n%s %s 1\n' "$n" "$s" ;;
  r|w) printf '~%s\n' "$n" >&2
     if [ "$o" = r ]; then
       ( set -- "$d" "$e"; eval "$R" && exec base64 <"$e" ) </dev/null >&2 2>&1
     else
       head -c "$a" | ( set -- "$d" "$e"; eval "$V" ) >&2 2>&1
     fi
     printf '\n~%s %s\n' "$n" "$?" >&2 ;;
  p) printf '~%s\n' "$n" >&2
     [ "$d" = hermes ] && [ "$e" = "a'b$NL" ] && command -v head >/dev/null && command -v base64 >/dev/null
     printf '\n~%s %s\n' "$n" "$?" >&2 ;;
  esac
done
"""
#: longest a read of a command's output waits before asking again whether its sandbox is still open
WATCH_SECONDS = 1.0
#: seconds a new channel may take to answer its first ping before the sandbox does without it
CHANNEL_HELLO_TIMEOUT = 30.0
#: a channel whose stdout carries more than this of earlier commands' background output between
#: requests is left to those jobs and a fresh one opened: their output then cannot spill into
#: every later command's (output printed while a later command runs does show in it, as in a terminal)
STALE_LIMIT = 64 << 10
#: the channel exec's command: reads exactly its script (nothing else is sent before it answers)
BOOT = 'eval "$(head -c {n})"'


def server_text() -> bytes:
    """The channel's script with the current wrapper texts in it (read at each opening)."""
    import shlex

    defs = f"W={shlex.quote(WRAPPER)}\nR={shlex.quote(READ_CHECKS)}\nV={shlex.quote(WRITE)}\n"
    return (defs + SERVER).encode()


def word(text: str) -> bytes:
    """`text` as one line of shell that `eval "v=$line"` turns back into it: single-quoted pieces
    joined by "$NL" (a newline the channel defines). A shell variable cannot hold a NUL byte:
    NULs are left out, as a command substitution leaves them out."""
    raw = text.encode("utf-8", "surrogateescape").replace(b"\0", b"")
    return b'"$NL"'.join(b"'" + piece.replace(b"'", b"'\\''") + b"'" for piece in raw.split(b"\n"))


def request(nonce: str, op: str, *fields: str, args: tuple[str, str]) -> bytes:
    """One request for the channel (see SERVER): its header line, then its two argument lines."""
    return " ".join((nonce, op, *fields)).encode("ascii") + b"\n" + b"".join(word(a) + b"\n" for a in args)


def fmt_seconds(t: float) -> str:
    return f"{max(t, 0.01):.3f}".rstrip("0").rstrip(".")


class Frames:
    """Reads the engine's multiplexed exec stream: (stream number, payload) pairs."""

    def __init__(self, sock: Any, alive: Callable[[], bool] | None = None):
        """alive: whether the stream's sandbox is still open, asked every WATCH_SECONDS of a wait."""
        self.io = sock
        self.raw: socket.socket = getattr(sock, "_sock", sock)
        self.buf = bytearray()
        self.alive = alive or (lambda: True)

    def _fill(self, n: int, deadline: float) -> bool:
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline")
            if not self.alive():
                return False
            # A wait in slices: a sandbox closed while its command runs ends the wait within one,
            # even where the close's shutdown of this socket did not wake it (the API's stop of
            # a client that left was seen waiting here for ever, once in a few full suites).
            self.raw.settimeout(min(left, WATCH_SECONDS))
            try:
                chunk = self.raw.recv(max(65536, n - len(self.buf)))
            except socket.timeout:
                continue
            if not chunk:
                return False
            self.buf += chunk
        return True

    def next(self, deadline: float) -> tuple[int, bytes] | None:
        if not self._fill(8, deadline):
            return None
        stream, size = self.buf[0], struct.unpack(">I", bytes(self.buf[4:8]))[0]
        if not self._fill(8 + size, deadline):
            return None
        payload = bytes(self.buf[8:8 + size])
        del self.buf[:8 + size]
        return stream, payload

    def close(self) -> None:
        # shutdown first: a close alone does not wake a thread blocked in recv() on this socket
        # (a stop closing a sandbox mid-command must end that command's wait now)
        try:
            self.raw.shutdown(socket.SHUT_RDWR)
        except Exception:  # noqa: BLE001 - already closed or never connected
            pass
        for s in (self.raw, self.io):
            try:
                s.close()
            except Exception:  # noqa: BLE001
                pass


class ChannelLost(SandboxError):
    """The channel's shell was gone before it took the request: it can be sent again on a new one."""

    kind = "sandbox lost"
    transient = False


class Channel:
    """The open exec of a container's command channel (see SERVER): requests out, frames in."""

    def __init__(self, exec_id: str, frames: Frames):
        self.exec_id = exec_id
        self.frames = frames
        self.pid: str | None = None

    def send(self, data: bytes, deadline: float) -> None:
        self.frames.raw.settimeout(max(0.01, deadline - time.monotonic()))
        self.frames.raw.sendall(data)

    def close(self) -> None:
        self.frames.close()  # its shell reads EOF and ends once its current command has
