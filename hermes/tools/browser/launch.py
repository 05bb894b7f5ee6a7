"""The local Chromium: started by us as an unprivileged user with its own sandbox, reached over CDP.

Each launch gets a fresh profile folder under BASE named `<owner pid>-<owner start time>-<random>`,
so that a later process can tell a profile whose owner died (a run killed with SIGKILL) from one
in use: `sweep()` kills every process still naming a dead owner's profile and removes the folder.
Chromium is also started with a parent-death signal (setpriv --pdeathsig), so a killed run
usually takes its browser with it at once; the sweep catches what that misses (the zygote and
renderer children, a machine without setpriv's option).
"""
from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hermes.errors import HermesError

log = logging.getLogger(__name__)

BASE = Path(tempfile.gettempdir()) / "hermes-browser"

#: Chromium's own services' endpoints: a loopback port nothing listens on. Sign-in (ListAccounts),
#: the Google APIs and the component updater's on-demand fetches (optimization guide manifests) ignore
#: --disable-background-networking/--disable-component-update; with their URLs here they send nothing
#: (tests/tools/test_browser_address_rules.py traps every request and sees none of them).
NOWHERE = "http://127.0.0.1:9"
#: one --disable-features (a second would replace it): translate, cast, the optimization guide's hints
#: and models, network time (clients2.google.com/time), CT log updates, autofill's server.
DISABLED_FEATURES = ("Translate", "MediaRouter", "DialMediaRouteProvider", "OptimizationHints",
                     "OptimizationHintsFetching", "OptimizationGuideModelDownloading", "OptimizationTargetPrediction",
                     "OptimizationGuideOnDeviceModel", "OnDeviceModelService", "NetworkTimeServiceQuerying",
                     "CertificateTransparencyComponentUpdater", "AutofillServerCommunication")
# Known needed offline: nothing phones home (component updates, sync, sign-in, safe-browsing, QUIC
# probes, first-run pages): these requests are the browser's own and never pass the route guard.
FLAGS = ["--headless", "--disable-gpu", "--disable-quic", "--no-first-run", "--no-default-browser-check",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-breakpad", "--disable-crash-reporter", f"--disable-features={','.join(DISABLED_FEATURES)}",
         "--disable-client-side-phishing-detection", "--disable-default-apps", "--disable-extensions",
         "--disable-component-extensions-with-background-pages", "--disable-domain-reliability",
         "--no-pings", "--metrics-recording-only", "--no-service-autorun",
         f"--gaia-url={NOWHERE}", f"--google-apis-url={NOWHERE}", f"--lso-url={NOWHERE}",
         f"--component-updater=url-source={NOWHERE}/",
         "--force-webrtc-ip-handling-policy=disable_non_proxied_udp", "--disable-dev-shm-usage",
         "--mute-audio", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]
# Profile preferences: no DNS prefetch or preconnect (connections the request checks would not see).
PREFERENCES = {"net": {"network_prediction_options": 2}, "download": {"prompt_for_download": False},
               "profile": {"default_content_setting_values": {"automatic_downloads": 2}}}


class LaunchError(HermesError, RuntimeError):
    pass


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (tells a live owner from a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(name: str) -> bool:
    try:
        pid, start, _ = name.split("-", 2)
        return _start_time(int(pid)) == start
    except ValueError:
        return True  # not one of ours: leave it alone


def processes_using(profile: Path) -> list[int]:
    """Pids whose command line names this profile (browser, zygotes, renderers, helpers)."""
    needle = str(profile).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def kill_profile(profile: Path) -> int:
    """Kill every process of this profile and remove it; returns how many were killed."""
    pids = processes_using(profile)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(profile, ignore_errors=True)
    Path(f"{profile}.log").unlink(missing_ok=True)
    return len(pids)


def sweep() -> int:
    """Kill the browsers of profiles whose owner process is gone; returns the processes killed."""
    if not BASE.is_dir():
        return 0
    killed = 0
    for profile in BASE.iterdir():
        if profile.is_dir() and not _owner_alive(profile.name):
            n = kill_profile(profile)
            killed += n
            log.warning("removed a browser profile left by a dead process (%s, %d process(es) killed)", profile.name, n)
    return killed


@dataclass
class LocalChromium:
    proc: subprocess.Popen
    profile: Path
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        kill_profile(self.profile)  # what the browser left (children, a wedged process), then the folder
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            log.warning("chromium pid %d did not exit", self.proc.pid)


def _prefix(user: str | None) -> list[str]:
    """setpriv: drop to `user` (keeping Chromium's own sandbox on) and die with our launching thread."""
    setpriv = shutil.which("setpriv")
    if user is None:
        return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
    if not setpriv:
        raise LaunchError("running Chromium as an unprivileged user needs setpriv (util-linux)")
    entry = pwd.getpwnam(user)
    group = grp.getgrgid(entry.pw_gid).gr_name
    return [setpriv, "--reuid", user, "--regid", group, "--init-groups", "--pdeathsig", "KILL", "--"]


def launch(executable: str, user: str | None, timeout: float, extra_flags: tuple[str, ...] = ()) -> LocalChromium:
    """Start a headless Chromium on a fresh profile; returns once its CDP port is known. `extra_flags`
    go after FLAGS (a browser standing in for a remote CDP one, e.g. behind a test's own proxy)."""
    sweep()
    BASE.mkdir(mode=0o711, exist_ok=True)
    os.chmod(BASE, 0o711)  # the browser user may enter its own folder, not list the others
    me = os.getpid()
    profile = BASE / f"{me}-{_start_time(me)}-{secrets.token_hex(4)}"
    (profile / "Default").mkdir(parents=True, mode=0o700)
    (profile / "Default" / "Preferences").write_text(json.dumps(PREFERENCES))
    if user is not None:
        entry = pwd.getpwnam(user)
        for path in (profile, profile / "Default", profile / "Default" / "Preferences"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        os.chmod(profile, 0o700)
    cmd = [*_prefix(user), executable, *FLAGS, *extra_flags, f"--user-data-dir={profile}", "about:blank"]
    env = {"HOME": str(profile), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
           "XDG_CONFIG_HOME": str(profile / ".config"), "XDG_CACHE_HOME": str(profile / ".cache")}
    stderr = open(f"{profile}.log", "wb")  # beside the profile: Chromium cannot write it, we can read it
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True, close_fds=True)
    finally:
        stderr.close()
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            first = port_file.read_text().split("\n", 1)[0].strip()
            if first.isdigit():
                return LocalChromium(proc, profile, int(first))
        except OSError:
            pass
        time.sleep(0.05)
    tail = _log_tail(profile)
    LocalChromium(proc, profile, 0).close()
    why = f"exited with status {proc.returncode}" if proc.poll() is not None else f"gave no CDP port within {timeout:g} s"
    raise LaunchError(f"chromium {why}: {tail}")


def _log_tail(profile: Path, limit: int = 800) -> str:
    log_file = Path(f"{profile}.log")
    try:
        lines = [ln for ln in log_file.read_text(errors="replace").splitlines() if "dbus" not in ln]
        return " | ".join(lines)[-limit:] or "(no output)"
    except OSError:
        return "(no output)"
    finally:
        log_file.unlink(missing_ok=True)
