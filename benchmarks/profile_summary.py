"""Summarize a py-spy ``--format raw --subprocesses`` profile of a pipeline run, by phase.

Each line of the raw file is one collapsed stack (``frame;frame;...``) and its sample count;
py-spy samples only threads that are running (not idle), so samples are CPU time
(``--rate 100``: one sample = 10 ms). A sample belongs to the phase of the asset function on
its stack (``raw_pages``, ``parsed_products``, ``products_table``, ``dead_letters``); samples
of no asset are start-up and orchestration (imports, loading definitions, Dagster's event
log), split into imports and the rest.

Run: ``python -m benchmarks.profile_summary profile.txt`` prints the Markdown summary.
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

PHASES = ("raw_pages", "parsed_products", "products_table", "dead_letters")
_LINE = re.compile(r":\d+\)$")
#: Frames that say nothing about where the time goes (event loop and call plumbing).
_PLUMBING = re.compile(
    r"^(<module>|_run_module_as_main|_run_code|main|run|_run|_run_once|run_forever|run_until_complete|Handle\._run|"
    r"BaseEventLoop\.|Runner\.|Context\.run|process |Thread\.|_bootstrap|__call__|wrapper|inner|invoke|"
    r"Command\.|MultiCommand\.|Group\.|BaseCommand\.|_call_with_frames_removed|BaseProcess\.|_process_worker)"
)


def _ranked(counter: Counter) -> list[tuple]:
    """Items by count, largest first; ties by key, so the summary is the same on every call."""
    return sorted(counter.items(), key=lambda item: (-item[1], str(item[0])))


_PROCESS = re.compile(r'process \d+:"[^"]*"')


def _frame(raw: str) -> str:
    return _LINE.sub(")", raw.strip())


def _without_fork_frames(frames: list[str]) -> list[str]:
    """A fork worker's stack without the parent's frames from ``ProcessPoolExecutor.submit`` down
    to the fork (py-spy shows them above the child's own: they would read as the fork costing
    the worker's whole time); the parent's frames above (the asset, ``top_up``) stay."""
    launch = next((i for i, f in enumerate(frames) if f.startswith("Popen._launch (") and "popen_fork" in f), None)
    if launch is None or launch == len(frames) - 1:  # not a child (the parent forking: its own cost)
        return frames
    submit = next((i for i in range(launch, -1, -1) if frames[i].startswith("ProcessPoolExecutor.submit (")), launch)
    return frames[:submit] + frames[launch + 1:]


#: Leaf frames of threads that py-spy counted although they were blocked (thread-pool workers
#: waiting for work, condition waits, selector waits): not CPU, reported apart.
WAITING = frozenset({
    "_worker (concurrent/futures/thread.py)", "Condition.wait (threading.py)", "select (selectors.py)",
    "EpollSelector.select (selectors.py)", "Event.wait (threading.py)", "Thread._wait_for_tstate_lock (threading.py)",
})


def _asset(frames: list[str]) -> str | None:
    for frame in frames:
        for phase in PHASES:
            if frame.startswith(phase + " (") and "defs/assets" in frame:
                return phase
    return None


def summarize(path: Path, top: int = 12) -> dict:
    """Per phase: samples, share of CPU, top inclusive and self frames (``name (file)`` -> samples).

    A phase is the asset whose function is on the stack; samples of the same process without it
    (its worker threads, its start-up imports, Dagster's step machinery) go to
    ``"<asset>: step process, outside the asset function"`` when that process ran one asset
    (the multiprocess executor's step processes), else to start-up/orchestration.
    """
    samples = []
    process_asset: dict[str, Counter] = defaultdict(Counter)
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        stack = _PROCESS.sub(lambda m: m.group(0).replace(";", ","), stack)  # a command line may hold ';'
        frames = [_frame(f) for f in stack.split(";") if f]
        pids = [f.split(":", 1)[0] for f in frames if f.startswith("process ")]
        frames = _without_fork_frames([f for f in frames if not f.startswith("process ")])
        if not frames:
            continue
        pid = pids[-1] if pids else "?"
        asset = _asset(frames)
        if asset:
            process_asset[pid][asset] += int(count)
        samples.append((pid, frames, int(count), asset))
    total = waiting = 0
    phase_samples: Counter = Counter()
    inclusive: dict[str, Counter] = defaultdict(Counter)
    self_time: dict[str, Counter] = defaultdict(Counter)
    handoff: dict[str, Counter] = defaultdict(Counter)
    for pid, frames, n, asset in samples:
        if frames[-1] in WAITING:
            waiting += n
            continue
        total += n
        if asset is None:
            owners = process_asset.get(pid)
            ours = [f for f in frames if "scrape_assets/" in f]
            if owners and len(owners) == 1:
                phase = f"{next(iter(owners))}: step process, outside the asset function"
            elif ours and any(f.startswith("_WorkItem.run") for f in frames):
                phase = f"worker threads (asyncio.to_thread): {ours[0].split(' (')[0]}"
            elif any(f.startswith("_find_and_load") for f in frames):
                phase = "imports (process starts)"
            else:
                phase = "dagster orchestration (no asset on the stack)"
        else:
            phase = asset
        phase_samples[phase] += n
        for frame in set(frames):
            inclusive[phase][frame] += n
        self_time[phase][frames[-1]] += n
        self_time["all"][frames[-1]] += n
        ours = [i for i, f in enumerate(frames) if "scrape_assets/" in f]
        if ours:
            i = ours[-1]
            handoff[phase][frames[i] + " -> " + (frames[i + 1] if i + 1 < len(frames) else "(itself)")] += n
    out = {"file": str(path), "samples": total, "cpu_s": total / 100, "waiting_samples": waiting,
           "processes": len({pid for pid, *_ in samples}), "phases": {}}
    for phase, n in _ranked(phase_samples):
        hot = [(f, c) for f, c in _ranked(inclusive[phase]) if not _PLUMBING.match(f) and c < 0.97 * n][:top]
        out["phases"][phase] = {
            "samples": n,
            "share": n / total if total else 0.0,
            "inclusive": hot,
            "self": _ranked(self_time[phase])[:top],
            "handoff": _ranked(handoff[phase])[:top],
        }
    out["all_self"] = _ranked(self_time["all"])[: top * 2]
    return out


def to_markdown(summary: dict) -> str:
    lines = [
        f"py-spy, {summary['samples']} samples at 100 Hz = {summary['cpu_s']:.1f} CPU s over "
        f"{summary['processes']} Python processes (`{Path(summary['file']).name}`); "
        f"{summary['waiting_samples'] / 100:.1f} s more were threads blocked in a wait, left out.",
        "",
        "| phase | CPU s | share |",
        "|---|---:|---:|",
    ]
    for phase, p in summary["phases"].items():
        lines.append(f"| {phase} | {p['samples'] / 100:.2f} | {100 * p['share']:.0f}% |")
    for phase, p in summary["phases"].items():
        lines += ["", f"**{phase}** ({p['samples'] / 100:.2f} CPU s): hottest frames, inclusive (share of the phase)", ""]
        lines += [f"- {100 * c / p['samples']:.0f}% `{f}`" for f, c in p["inclusive"][:6]]
        if p.get("handoff"):
            lines += ["", "where our code spends it (deepest `scrape_assets` frame -> what it calls):", ""]
            lines += [f"- {100 * c / p['samples']:.0f}% `{f}`" for f, c in p["handoff"][:10]]
        lines += ["", "self time: " + ", ".join(f"`{f}` {100 * c / p['samples']:.0f}%" for f, c in p["self"][:6])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(to_markdown(summarize(Path(sys.argv[1]))))
