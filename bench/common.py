"""Shared plumbing: measured child processes, the mock server, Docker clean-up, machine facts."""
from __future__ import annotations

import json
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- memory of a process tree


def _pss_kib(pid: int) -> int:
    """Proportional set size of one process (shared pages split between sharers), in KiB."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _not_exec_yet(p: "psutil.Process") -> bool:
    """A child between vfork and exec (subprocess's way of starting one) shares its parent's
    memory, and its smaps report all of it again: such a child has its parent's command line.
    Counting it doubled a tree's peak whenever a sample fell in that moment."""
    try:
        parent = p.parent()
        return parent is not None and p.cmdline() == parent.cmdline() and p.exe() == parent.exe()
    except psutil.Error:
        return False


class TreeSampler:
    """Polls a process and all its descendants: peak summed PSS and RSS, peak process count."""

    def __init__(self, pid: int, interval: float = 0.25):
        self.pid, self.interval = pid, interval
        self.peak_pss_kib = 0
        self.peak_rss_kib = 0
        self.peak_procs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tree-sampler")

    def start(self) -> "TreeSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def sample(self) -> None:
        try:
            root = psutil.Process(self.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            return
        pss = rss = 0
        for p in procs:
            if _not_exec_yet(p):
                continue
            pss += _pss_kib(p.pid)
            try:
                rss += p.memory_info().rss >> 10
            except psutil.Error:
                pass
        self.peak_pss_kib = max(self.peak_pss_kib, pss)
        self.peak_rss_kib = max(self.peak_rss_kib, rss)
        self.peak_procs = max(self.peak_procs, len(procs))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def engine_cpu() -> float:
    """CPU seconds used so far by the Docker engine's long-lived processes (dockerd, containerd)."""
    total = 0.0
    for p in psutil.process_iter(["name"]):
        if p.info["name"] in ("dockerd", "containerd"):
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    return total


def machine_busy() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, wall time) for load figures."""
    t = psutil.cpu_times()
    return (t.user + t.nice + t.system + t.irq + t.softirq + t.steal), time.time()


@dataclass
class Measured:
    rc: int
    wall: float                 # seconds, launch to exit
    cpu: float                  # user+sys seconds of the process and every descendant it reaped
    peak_pss_mib: float
    peak_rss_mib: float
    peak_procs: int
    started: float              # time.time() at launch
    ended: float
    engine_cpu: float = 0.0     # dockerd + containerd CPU seconds during the run
    machine_busy: float = 0.0   # busy CPU seconds of the whole machine during the run (all users)
    log_path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def run_measured(cmd: list[str], *, env: dict[str, str], cwd: Path, log_path: Path,
                 timeout: float | None = None) -> Measured:
    """Run a command to completion, measuring wall time, CPU of its whole tree and peak memory."""
    cwd.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cpu0, eng0, (busy0, _) = _children_cpu(), engine_cpu(), machine_busy()
    with open(log_path, "wb") as out:
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        sampler = TreeSampler(proc.pid).start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"timeout after {timeout}s: killing {cmd[:3]}")
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        except BaseException:  # interrupted: take the system under test (its own session) down too
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            sampler.stop()
            raise
        t1 = time.time()
        sampler.stop()
    cpu = _children_cpu() - cpu0
    busy1, _ = machine_busy()
    return Measured(rc=rc, wall=t1 - t0, cpu=cpu, peak_pss_mib=sampler.peak_pss_kib / 1024,
                    peak_rss_mib=sampler.peak_rss_kib / 1024, peak_procs=sampler.peak_procs,
                    started=t0, ended=t1, engine_cpu=engine_cpu() - eng0, machine_busy=busy1 - busy0,
                    log_path=str(log_path))


# --------------------------------------------------------------------------- the model server


class MockServer:
    """`python -m bench.mockserver` in its own process; stop() returns its CPU seconds.

    Always this tree's mock, whichever commit of ours is measured: it is the endpoint, the same
    for both sides of an A/B."""

    def __init__(self, *, latency: float, turns: int, log_path: Path, options: tuple = ()):
        self.latency, self.turns, self.log_path = latency, turns, log_path
        self.options = [str(o) for o in options]  # more mockllm options, e.g. ("--rpm", 600)
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.mockserver", "--port", "0", "--latency", str(self.latency),
             "--turns", str(self.turns), *self.options],
            stdout=subprocess.PIPE, stderr=self._log, text=True, env=env, cwd=REPO)
        line = self.proc.stdout.readline()
        m = re.search(r"(http://\S+/v1)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"mock server did not start: {line!r} (see {self.log_path})")
        self.url = m.group(1)
        self.root = self.url[: -len("/v1")]
        return self.url

    def times(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.root + "/_bench/times", timeout=10) as r:
            return json.loads(r.read())

    def stats(self) -> dict[str, Any]:
        """mockllm's counters: requests, ok, rate_limited (429 of --rpm), injected_errors, ..."""
        with urllib.request.urlopen(self.root + "/_mock/stats", timeout=10) as r:
            return json.loads(r.read())

    def cpu(self) -> float:
        try:
            t = psutil.Process(self.proc.pid).cpu_times()
            return t.user + t.system
        except psutil.Error:
            return 0.0

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "MockServer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# --------------------------------------------------------------------------- Docker clean-up

#: only containers these filters match are ever removed by the benchmark
BENCH_LABEL = "hermes-bench"          # the sandbox-limit loop's containers
REFERENCE_LABEL = "hermes-agent"      # the reference system labels its containers so


def remove_containers(label_filter: str) -> int:
    """Force-remove the containers whose labels match `label_filter` (e.g. 'hermes-agent')."""
    try:
        out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label_filter}"],
                             capture_output=True, text=True, timeout=60).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if out:
        subprocess.run(["docker", "rm", "-f", *out], capture_output=True, timeout=300)
    return len(out)


# --------------------------------------------------------------------------- machine facts


def machine_facts() -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    docker_version = ""
    try:
        docker_version = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                                        capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(), "cpu_model": cpu_model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(), "python": platform.python_version(),
        "docker_engine": docker_version, "loadavg_at_start": [round(x, 2) for x in load],
    }


def other_load_sample(seconds: float = 2.0) -> float:
    """Busy cores of the whole machine over a short idle moment of the benchmark (others' load)."""
    b0, t0 = machine_busy()
    time.sleep(seconds)
    b1, t1 = machine_busy()
    return (b1 - b0) / (t1 - t0)


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


# --------------------------------------------------------------------------- a standing Prefect server


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrefectServer:
    """`prefect server start` on a loopback port (SQLite in a scratch PREFECT_HOME), for the
    "ours, Prefect server already running" variant: how deployments run, without the embedded
    server's start-up in every invocation. cpu() counts its whole process tree."""

    def __init__(self, home: Path, log_path: Path):
        self.home, self.log_path = home, log_path
        self.proc: subprocess.Popen | None = None
        self.api_url = ""

    def start(self, timeout: float = 180.0) -> str:
        self.home.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(PREFECT_HOME=str(self.home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false",
                   PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE="200",
                   PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL="1")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                      "--port", str(port)], env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.api_url = f"http://127.0.0.1:{port}/api"
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited early: see {self.log_path}")
            try:
                with urllib.request.urlopen(self.api_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self.api_url
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"prefect server did not answer within {timeout}s: see {self.log_path}")

    def cpu(self) -> float:
        total = 0.0
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root] + root.children(recursive=True):
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        return total

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
