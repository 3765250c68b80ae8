"""Run one command and measure it: wall time, CPU seconds, peak RSS, processes started.

* CPU seconds and the largest process's peak RSS come from ``os.wait4``: the kernel's
  rusage of the child, including every descendant it waited for (Dagster's step processes,
  Scrapy's nothing), so nothing is sampled or missed.
* Other load on the machine: the busy CPU seconds of the whole machine (``/proc/stat``) during
  the command, minus the command's own, the catalogue server's and this measuring process's
  (its poller; ``extra["measuring_cpu_s"]``), is ``foreign_cpu_s``: CPU
  that other programs took from the 2 cores meanwhile (other people's test suites). Before each
  command :func:`wait_for_quiet` waits (bounded) until the machine is nearly idle.
* The process tree's peak RSS (sum over live processes) and the processes started come from
  polling the tree with psutil every :data:`POLL_S` seconds; a process living less than that
  may be missed (Dagster's step processes live for seconds).
* The tree's peak PSS (proportional set size: a page shared by n processes counts 1/n in
  each, so the fork workers' copy-on-write pages inherited from the command count once) is
  read every :data:`PSS_EVERY` polls (~1 s): the RSS sum counts those shared pages once per
  process, PSS is what the tree really holds. Sampled, so a peak shorter than ~1 s may be missed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

POLL_S = 0.05
#: The tree's PSS is read every this many polls (~7 ms a process of 300 MB from
#: ``/proc/PID/smaps_rollup``: every poll would cost the measured command a few % of a core).
PSS_EVERY = 20


@dataclass
class Measurement:
    """One command's cost. ``rss_*`` in MB (10^6 bytes); ``cpu_s`` = user + system."""

    command: list[str]
    returncode: int
    wall_s: float
    cpu_s: float
    user_s: float
    sys_s: float
    rss_max_process_mb: float
    rss_peak_tree_mb: float
    processes: int
    python_processes: int
    foreign_cpu_s: float = 0.0
    busy_before: float = 0.0
    stdout_path: str = ""
    stderr_path: str = ""
    extra: dict = field(default_factory=dict)
    pss_peak_tree_mb: float = 0.0


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores; /proc/stat, idle and iowait excluded)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(*, busy_below: float = 0.15, window_s: float = 1.0, max_wait_s: float = 60.0) -> float:
    """Wait until the machine's busy share over ``window_s`` is below ``busy_below`` (of all cores),
    at most ``max_wait_s``; return the last share seen (so a run started on a busy machine says so)."""
    cores = os.cpu_count() or 1
    deadline = time.monotonic() + max_wait_s
    while True:
        before = machine_busy_s()
        time.sleep(window_s)
        share = (machine_busy_s() - before) / (window_s * cores)
        if share < busy_below or time.monotonic() > deadline:
            return share


def _process_cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return times.user + times.system


class _TreePoller(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.root = pid
        self.stop = threading.Event()
        self.peak_rss = 0
        self.peak_pss = 0
        self.seen: dict[tuple[int, float], str] = {}

    def run(self) -> None:
        try:
            root = psutil.Process(self.root)
        except psutil.NoSuchProcess:
            return
        polls = 0
        while not self.stop.is_set():
            total = pss = 0
            with_pss = polls % PSS_EVERY == 0
            polls += 1
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for proc in procs:
                try:
                    with proc.oneshot():
                        total += proc.memory_info().rss
                        if with_pss:
                            pss += proc.memory_full_info().pss
                        key = (proc.pid, proc.create_time())
                        if key not in self.seen:
                            self.seen[key] = proc.name()
                except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                    continue
            self.peak_rss = max(self.peak_rss, total)
            self.peak_pss = max(self.peak_pss, pss)
            self.stop.wait(POLL_S)


def run_measured(
    command: list[str], *, env: dict | None = None, cwd: str | Path | None = None, log_prefix: Path,
    timeout_s: float = 1800, server_pid: int | None = None, quiet: bool = True,
) -> Measurement:
    """Run ``command`` to completion (stdout/stderr to ``log_prefix``.out/.err) and measure it.

    Args:
        server_pid: the catalogue server's process, whose CPU is not counted as foreign.
        quiet: first wait for a nearly idle machine (:func:`wait_for_quiet`).

    Raises:
        TimeoutError: it ran longer than ``timeout_s`` (its process group is killed first).
    """
    log_prefix.parent.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_prefix.with_suffix(".out"), log_prefix.with_suffix(".err")
    busy_before = wait_for_quiet() if quiet else 0.0
    machine_before, server_before = machine_busy_s(), _process_cpu_s(server_pid)
    runner_before = sum(os.times()[:2])  # this process (the poller thread included): not "others"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        started, clock_started = time.perf_counter(), time.time()
        proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=err, start_new_session=True)
        poller = _TreePoller(proc.pid)
        poller.start()
        killer = threading.Timer(timeout_s, lambda: os.killpg(proc.pid, signal.SIGKILL))
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        wall = time.perf_counter() - started
        # The system clock stepped meanwhile (a VM's clock corrected): Dagster's event
        # timestamps, hence in-run and step times, are off by this much; wall_s is not.
        clock_step = (time.time() - clock_started) - wall
        poller.stop.set()
        poller.join()
    machine_cpu = machine_busy_s() - machine_before
    server_cpu = _process_cpu_s(server_pid) - server_before
    runner_cpu = sum(os.times()[:2]) - runner_before
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode == -signal.SIGKILL and wall >= timeout_s:
        raise TimeoutError(f"{' '.join(command)} ran longer than {timeout_s} s; logs in {err_path}")
    names = list(poller.seen.values())
    return Measurement(
        command=command,
        returncode=proc.returncode,
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime,
        user_s=usage.ru_utime,
        sys_s=usage.ru_stime,
        rss_max_process_mb=usage.ru_maxrss * 1024 / 1e6,
        rss_peak_tree_mb=poller.peak_rss / 1e6,
        pss_peak_tree_mb=poller.peak_pss / 1e6,
        extra={"server_cpu_s": round(server_cpu, 2), "measuring_cpu_s": round(runner_cpu, 2),
               "clock_step_s": round(clock_step, 3)},
        processes=len(names),
        python_processes=sum(1 for n in names if n.startswith("python") or n in ("dagster", "scrape-assets")),
        foreign_cpu_s=max(0.0, machine_cpu - (usage.ru_utime + usage.ru_stime) - server_cpu - runner_cpu),
        busy_before=busy_before,
        stdout_path=str(out_path),
        stderr_path=str(err_path),
    )
