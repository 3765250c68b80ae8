"""Which process runs a run, and failing the runs whose process is gone (killed with SIGKILL).

A run executed in the process that launched it (``dagster asset materialize``, ``dagster
job execute``, ``scrape-assets demo``) has nobody watching it: killed with SIGKILL (or by
the kernel's OOM killer), it stays "started" for good, counted against the instance's
``max_concurrent_runs`` and, with S3 storage, holding its host's pool slot, so the next
run's ``raw_pages`` waits for it silently (Dagster's in-process executor, using a core).
Dagster's own run monitoring covers only runs its run launcher started.

So each run is tagged with the process running it (:data:`PROCESS_TAG`: boot id, pid
namespace, pid and start time, exact on Linux; set before its first step by the project's
executor, :mod:`scrape_assets.defs.executor`, by ``raw_pages`` in runs of
``execute_in_process``, by ``scrape-assets demo`` at launch), and :func:`fail_dead_runs` (called by the
next ``scrape-assets demo``, and every minute by the daemon's ``dead_run_sensor``) marks
failed the runs "started" by a process that is gone on this machine and frees their slots.
Runs of other machines, containers or boots cannot be told from here and are left alone
(``scrape-assets fail-run RUN_ID`` ends them on the operator's word).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

#: Tags of a run: who launched it (``scrape-assets demo`` sets it), and the process and host
#: running it, so a later process can tell the run was left "started" by a process that is gone.
LAUNCHED_BY_TAG, PID_TAG, HOST_TAG = "scrape/launched_by", "scrape/pid", "scrape/host"
#: ``<boot id>:<pid namespace>:<pid>:<start time in clock ticks>`` of the process running a
#: run (Linux), so a later process can tell, exactly, that it is gone.
PROCESS_TAG = "scrape/process"
#: The id of the run :data:`PROCESS_TAG` was set for: a re-execution inherits its parent's
#: tags (the UI's, Dagster's automatic retries), and the parent's process, gone, is not the
#: re-execution's (which may not run ``raw_pages`` to tag its own). Only a run whose tag
#: names itself is judged by it.
PROCESS_RUN_TAG = "scrape/process_run"
DEMO_LAUNCHER = "scrape-assets demo"


def _start_ticks(pid: int) -> str | None:
    """Process ``pid``'s start time in clock ticks after boot (``proc(5)``: field 22 of
    ``/proc/PID/stat``, readable for every process); None when there is no such process.

    Raises:
        OSError: ``/proc`` cannot be read (not Linux).
    """
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (FileNotFoundError, ProcessLookupError):
        return None


def _this_kernel_and_namespace() -> tuple[str, str]:
    """This boot's id (``/proc/sys/kernel/random/boot_id``) and this process's pid namespace (its inode).

    Raises:
        OSError: not Linux.
    """
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return boot, str(os.stat("/proc/self/ns/pid").st_ino)


def process_identity() -> str | None:
    """:data:`PROCESS_TAG`'s value for this process; None where ``/proc`` does not tell (not Linux)."""
    try:
        boot, namespace = _this_kernel_and_namespace()
        return f"{boot}:{namespace}:{os.getpid()}:{_start_ticks(os.getpid())}"
    except (OSError, IndexError):
        return None


def process_tags(run_id: str) -> dict[str, str]:
    """:data:`PID_TAG`, :data:`HOST_TAG` and (on Linux) :data:`PROCESS_TAG` of this process,
    running run ``run_id`` (:data:`PROCESS_RUN_TAG`)."""
    tags = {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname(), PROCESS_RUN_TAG: run_id}
    if identity := process_identity():
        tags[PROCESS_TAG] = identity
    return tags


def tag_run_process(instance, run) -> bool:
    """Tag ``run`` (a ``DagsterRun`` of ``instance``) with this process (:func:`process_tags`),
    unless its tags name this process for it already; nothing where ``/proc`` does not tell.

    Returns False when the instance refused the write (locked, down): logged, never raised,
    as the tag is bookkeeping for :func:`fail_dead_runs`; the run goes on, and only a kill
    of it would go unnoticed.
    """
    tags = process_tags(run.run_id)
    if PROCESS_TAG not in tags or run_process(run) == tags[PROCESS_TAG]:  # none to set, or set already
        return True
    try:
        instance.add_run_tags(run.run_id, tags)
    except Exception as exc:  # noqa: BLE001 - whatever the instance's storage raises
        logger.warning("run %s: could not tag it with its process (%s: %s): if it is killed, nothing will mark it "
                       "failed (scrape-assets fail-run will)", run.run_id, type(exc).__name__, exc)
        return False
    return True


def run_process(run) -> str | None:
    """The :data:`PROCESS_TAG` of a ``DagsterRun`` when it was set for that run, else None
    (none set, or inherited from the run it re-executes: :data:`PROCESS_RUN_TAG`)."""
    if run.tags.get(PROCESS_RUN_TAG) != run.run_id:
        return None
    return run.tags.get(PROCESS_TAG) or None


def process_gone(identity: str) -> bool | None:
    """Whether the process of a :data:`PROCESS_TAG` value no longer runs.

    True: no process has that number now, or the one that has it started at another time
    (the number reused). False: it runs. None: not to be told from here, another boot
    (another machine, or this one before a restart: they cannot be told apart), another
    pid namespace (another container), no ``/proc``, or a process ``/proc`` hides from this
    user (``hidepid``) that ``kill(pid, 0)`` says exists.
    """
    try:
        boot, namespace, pid, ticks = identity.split(":")
        if (boot, namespace) != _this_kernel_and_namespace() or not pid.isdigit():
            return None
        now = _start_ticks(int(pid))
    except (OSError, ValueError, IndexError):
        return None
    if now is None:  # no /proc/PID: gone, or hidden (procfs hidepid=2, systemd ProtectProc=invisible)
        try:
            os.kill(int(pid), 0)  # signal 0: only asks whether the process exists
        except ProcessLookupError:
            return True
        except (PermissionError, OverflowError):  # exists, another user's (or no pid at all: not ours to say)
            pass
        return None  # it exists, hidden from /proc: its start time cannot be compared
    return now != ticks


@dataclass(frozen=True)
class DeadRun:
    """A run :func:`fail_dead_runs` marked failed."""

    run_id: str
    line: str  # what was done, one line ("scrape-assets: run ..., marked failed")
    #: launched from the code location (the daemon, the UI): run_failure_alert_sensor alerts for it
    of_code_location: bool


def pools_held(instance, run_id: str) -> list[str]:
    """The pools in which ``run_id`` holds a concurrency slot, sorted."""
    storage = instance.event_log_storage
    return sorted(key for key in storage.get_concurrency_keys()
                  if any(slot.run_id == run_id for slot in storage.get_concurrency_info(key).claimed_slots))


def fail_dead_runs(instance) -> list[DeadRun]:
    """Mark failed the runs left "started" or "starting" by a process that was killed on this
    machine since it booted (:data:`PROCESS_TAG`), and give back the concurrency slots they
    held; return what was done for each.

    Judged only when the run's process ran on this boot of this kernel in this pid namespace:
    runs of other machines, containers or boots, runs without the tag or with one inherited
    from the run they re-execute (:func:`run_process`), and runs whose process still runs
    are left alone. The failure is the instance's (``RUN_FAILURE`` event with the reason); the
    run-failure alert sensor sees it for runs of the code location (launched by the daemon or
    the UI), not for command-line runs, which belong to none.
    """
    import dagster as dg

    live = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
    dead = []
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=live)):
        identity = run_process(run)
        if not identity or not process_gone(identity):
            continue
        current = instance.get_run_by_id(run.run_id)  # another process may have done it already
        if current is None or current.status not in live:
            continue
        pid = identity.split(":")[2]
        launcher = run.tags.get(LAUNCHED_BY_TAG, "")
        what = f"the {launcher} process" if launcher else "the process"
        instance.report_run_failed(current, message=f"{what} running it (pid {pid} on {run.tags.get(HOST_TAG, '?')}) "
                                                    "is gone: it was killed")
        pools = pools_held(instance, run.run_id)
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        freed = f"; its slot{'s' if len(pools) > 1 else ''} in {', '.join(pools)} freed" if pools else ""
        dead.append(DeadRun(
            run.run_id,
            f"scrape-assets: run {run.run_id}, left started by a{' ' + launcher if launcher else ' process'} that is "
            f"gone (pid {pid}), marked failed{freed}",
            of_code_location=run.remote_job_origin is not None,
        ))
    return dead
