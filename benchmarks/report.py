"""Render ``results.json`` of a benchmark run as BENCHMARKS.md (tables, targets, analysis)."""

from __future__ import annotations

import re
from pathlib import Path


def _f(value, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}{suffix}"
    return str(value)


def _rate(pages, seconds):
    return pages / seconds if pages and seconds else None


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out + [""]


FAILED = " ⚠ FAILED CHECK"


def _flag(r: dict | None) -> str:
    """The mark of a run that failed its own check (exit code, pages, rows); empty when it passed."""
    return FAILED if r is not None and not r.get("ok", True) else ""


def _runs(r: dict, key: str = "wall_s", fmt: str = "{:.1f}") -> str:
    """Every run's ``key`` when the row is the median of several (``runs_<key>``), else empty."""
    values = r.get(f"runs_{key}") or []
    return ", ".join(fmt.format(v) for v in values) if len(values) > 1 else ""


THROUGHPUT_HEADER = ["pages", "c", "tool", "wall s", "pages/s", "in-run s", "in-run pages/s", "CPU s", "CPU ms/page",
                     "RSS max MB", "RSS tree MB", "PSS tree MB", "Python procs", "others' CPU s", "ours/Scrapy",
                     "wall s of each run"]


def throughput_rows(results: dict) -> list[list]:
    rows = []
    for size, res in results["sizes"].items():
        pages = int(size)
        for c, pair in res.get("throughput", {}).items():
            scrapy_rate = _rate(pages, pair["scrapy"]["wall_s"])
            for tool in ("scrapy", "ours"):
                r = pair[tool]
                rate = _rate(pages, r["wall_s"])
                in_run_s = None if clock_stepped(r) else r.get("in_run_s")
                in_run = _rate(pages, in_run_s)
                ratio = f"**{rate / scrapy_rate:.2f}×**" if tool == "ours" and rate and scrapy_rate else ""
                name = "Scrapy spider" if tool == "scrapy" else "pipeline (`dagster asset materialize`)"
                rows.append([
                    f"{pages:,}", c, name + _flag(r), _wall(r), _f(rate, 0),
                    _f(in_run_s), _f(in_run, 0), _f(r["cpu_s"]), _f(1000 * r["cpu_s"] / pages, 2),
                    _f(r["rss_max_process_mb"], 0), _f(r["rss_peak_tree_mb"], 0), _f(r.get("pss_peak_tree_mb") or None, 0),
                    r["python_processes"],
                    _f(r.get("foreign_cpu_s")), ratio, _runs(r),
                ])
    return rows


STEPS = ("raw_pages", "parsed_products", "products_table", "dead_letters")
STEP_HEADER = ["wall", "start + exit", *STEPS, "other"]


#: Seconds the system clock may move apart from the monotonic one during a command before
#: its Dagster-timed figures (in-run, steps: event timestamps) are not shown.
CLOCK_STEP_TOLERANCE_S = 0.25


def clock_stepped(o: dict) -> bool:
    """Whether the system clock stepped during run ``o`` (its in-run and step times, from Dagster's
    event timestamps, are then wrong by that step; its wall time is monotonic): measured by
    the harness (``extra.clock_step_s``), or seen as an in-run time longer than the wall time
    (runs measured before the harness recorded it)."""
    step = (o.get("extra") or {}).get("clock_step_s")
    return (step is not None and abs(step) > CLOCK_STEP_TOLERANCE_S) or (o.get("in_run_s") or 0) > o["wall_s"]


CLOCK_NOTE = ("† the system clock stepped during this run (the VM's clock was corrected), so its in-run and "
              "step times, which come from Dagster's event timestamps, are not shown; its wall time is "
              "monotonic and stands.")


def _wall(o: dict) -> str:
    """``o``'s wall time, marked † when the clock stepped during it (:data:`CLOCK_NOTE`)."""
    return _f(o["wall_s"]) + (" †" if clock_stepped(o) else "")


def reparse_rows(results: dict) -> list[list]:
    """The re-parse table's rows (one per size re-parsed)."""
    rows = []
    for size, res in results["sizes"].items():
        rp = res.get("reparse")
        if not rp:
            continue
        pages, o, b = int(size), rp["ours"], rp["bare"]
        stepped = clock_stepped(o)
        step = None if stepped else o["steps"].get("parsed_products")
        rows.append([f"{pages:,}{_flag(o)}", _wall(o), _f(pages / o["wall_s"], 0),
                     _f(step, 2), _f(_rate(pages, step), 0), _f(None if stepped else o["steps"].get("products_table"), 2),
                     _f(o["cpu_s"]), _f(o["rss_max_process_mb"], 0),
                     o["http_requests"], _f(o.get("foreign_cpu_s")), _f(b["pages_per_s"], 0),
                     f"**{pages / o['wall_s'] / b['pages_per_s']:.0%}**", f"{_rate(pages, step) / b['pages_per_s']:.0%}" if step else "—",
                     _runs(o), _runs(b, "pages_per_s", "{:,.0f}")])
    return rows


def clock_note(rows: list[list]) -> list[str]:
    """:data:`CLOCK_NOTE` (and a blank line) when a row of the table above is marked †, else nothing."""
    return [CLOCK_NOTE, ""] if any("†" in str(cell) for row in rows for cell in row) else []


def _step_cells(o: dict) -> list[str]:
    """``o``'s wall time split: outside the run, each step, in-run time outside the steps (seconds)."""
    if clock_stepped(o):
        return [_wall(o), *(["—"] * (len(STEP_HEADER) - 1))]
    steps = o.get("steps", {})
    in_steps = sum(v for v in steps.values() if v)
    before = o["wall_s"] - (o.get("in_run_s") or 0)
    return [_f(o["wall_s"]), _f(before), *(_f(steps.get(s), 2) for s in STEPS), _f((o.get("in_run_s") or 0) - in_steps)]


def step_rows(results: dict) -> list[list]:
    rows = []
    for size, res in results["sizes"].items():
        for c, pair in res.get("throughput", {}).items():
            rows.append([f"{int(size):,}", c, *_step_cells(pair["ours"])])
    return rows


def _all_ours(res: dict) -> list[dict]:
    """Every pipeline row of one size: throughput, re-parse, incremental."""
    runs = [pair["ours"] for pair in res.get("throughput", {}).values()]
    if res.get("reparse"):
        runs.append(res["reparse"]["ours"])
    # The reported incremental runs only: not the unreported run back on the unchanged catalogue
    # (restore_base) nor the one under py-spy.
    runs += [r for label, r in res.get("incremental", {}).items()
             if label not in ("first", "profile_unchanged", "restore_base") and r]
    return runs


def _invalid(**runs: dict | None) -> str | None:
    """A verdict for a target fed by a run that failed its own check (exit code, pages, rows), else None."""
    failed = [name for name, run in runs.items() if run is not None and not run.get("ok", True)]
    return f"invalid: the {', '.join(failed)} run failed its check (see its log)" if failed else None


def targets(results: dict) -> list[list]:
    rows = []
    sizes = results["sizes"]
    for size, res in sizes.items():
        t = res.get("throughput", {})
        if "16" in t:
            ours, scrapy = t["16"]["ours"], t["16"]["scrapy"]
            ratio = scrapy["wall_s"] / ours["wall_s"]
            in_run = (scrapy["in_run_s"] / ours["in_run_s"]) if scrapy.get("in_run_s") and ours.get("in_run_s") \
                and not clock_stepped(ours) and not clock_stepped(scrapy) else None
            rows.append([f"fetch+store+parse+load ≥ 2× Scrapy's pages/s, c=16, {int(size):,} pages",
                         f"{ratio:.2f}× end to end" + (f" ({in_run:.2f}× excluding process start)" if in_run else ""),
                         _invalid(pipeline=ours, Scrapy=scrapy)
                         or ("met" if ratio >= 2 else f"missed: {ratio / 2:.0%} of the target ({2 / ratio:.2f}× too slow)")])
        if "16" in t and "64" in t:
            r16, r64 = int(size) / t["16"]["ours"]["wall_s"], int(size) / t["64"]["ours"]["wall_s"]
            verdict = "met" if r64 >= r16 else f"missed: {r64 / r16:.1%} of c=16"
            runs16, runs64 = t["16"]["ours"].get("runs_wall_s") or [], t["64"]["ours"].get("runs_wall_s") or []
            if r64 < r16 and runs16 and runs64 and min(runs64) <= max(runs16):
                verdict += (f" (the runs overlap: c=64 {min(runs64):.1f}–{max(runs64):.1f} s, "
                            f"c=16 {min(runs16):.1f}–{max(runs16):.1f} s)")
            rows.append([f"throughput at c=64 not lower than at c=16, {int(size):,} pages", f"{r64:.0f} vs {r16:.0f} pages/s",
                         _invalid(**{"c=16 pipeline": t["16"]["ours"], "c=64 pipeline": t["64"]["ours"]}) or verdict])
    reparse_size = "10000" if "reparse" in sizes.get("10000", {}) else next((s for s in sizes if "reparse" in sizes[s]), None)
    if reparse_size:
        rp = sizes[reparse_size]["reparse"]
        pages = int(reparse_size)
        ours_rate, bare_rate = pages / rp["ours"]["wall_s"], rp["bare"]["pages_per_s"]
        step = None if clock_stepped(rp["ours"]) else rp["ours"]["steps"].get("parsed_products")
        note = "" if reparse_size == "10000" else f" (measured at {pages:,} pages; 10,000 not run)"
        workers = rp["ours"].get("parse_workers")
        rows.append([f"re-parse backfill ≥ 70% of bare selectolax's pages/s at 10,000 pages{note}",
                     f"{ours_rate / bare_rate:.0%} end to end ({ours_rate:.0f} vs {bare_rate:.0f} pages/s; ours parses in "
                     f"{workers or 'its'} fork workers, the bare loop in one process)"
                     + (f"; parsed_products step alone {pages / step / bare_rate:.0%}" if step else ""),
                     _invalid(**{"re-parse": rp["ours"]})
                     or ("met" if ours_rate >= 0.7 * bare_rate else f"missed by {(0.7 - ours_rate / bare_rate) * 100:.0f} points")])
    daily = sizes.get("1000", {}).get("daily")
    if daily:
        one, per = daily["schedule"], daily["per_category"]
        rows.append(["a daily refresh of all categories costs one process start, not one per category",
                     f"schedule: {one['runs']} run, 1 CLI launch, {one['python_processes']} Python processes; per category: "
                     f"{per['runs']} launches, {per['python_processes']:.0f} Python processes",
                     _invalid(**{"schedule's": one, "per-category": per})
                     or ("met (one run, one CLI launch)" if one["runs"] == 1 else "missed")])
    for size, res in sizes.items():
        inc = res.get("incremental")
        if inc:
            first = inc["first"]
            for label, how in (("unchanged", "every page revalidated (default)"),
                               ("unchanged_first_page", "spec opt-in `revalidate: first_page`, which gives up "
                                "exactness: a change on a later page that leaves page 1 unchanged is missed"),
                               ("unchanged_sitemap", "spec opt-in `revalidate: sitemap`: pages the site's sitemap dates "
                                "no later than their saved copy are kept without a request, page 1 of each category is "
                                "revalidated as the check; exact as far as the site keeps its sitemap's lastmod current")):
                second = inc.get(label)
                if not second:
                    continue
                share = second["wall_s"] / first["wall_s"]
                ok = share <= 0.25 and second.get("pages_parsed") == 0
                rows.append([f"unchanged second run ≤ 25% of the first's wall time, 0 pages re-parsed ({int(size):,} pages; {how})",
                             f"{share:.0%} ({second['wall_s']:.1f} s vs {first['wall_s']:.1f} s), {second.get('pages_parsed')} pages re-parsed",
                             _invalid(first=first, second=second)
                             or ("met" if ok else f"missed: {share:.0%} of the first run (target 25%)")])
    big = sizes.get("10000", {})
    if big.get("throughput"):
        runs = _all_ours(big)
        worst = max(r.get("rss_max_process_mb_all_runs", r["rss_max_process_mb"]) for r in runs)
        pss = max((r.get("pss_peak_tree_mb_all_runs", r.get("pss_peak_tree_mb")) or 0 for r in runs), default=0)
        # Judged on what the whole pipeline holds (the command and its fork workers, shared pages
        # counted once: PSS) when measured, else on the largest process; both shown.
        judged, what = (pss, "the whole process tree's PSS") if pss else (worst, "the largest process")
        verdict = _invalid(**{f"10,000-page pipeline ({i + 1})": r for i, r in enumerate(runs)}) or (
            f"met ({what})" if judged <= 300 else f"missed by {judged - 300:.0f} MB ({what})")
        rows.append(["peak RSS ≤ 300 MB at 10,000 pages",
                     (f"{pss:.0f} MB PSS of the whole process tree (sampled ~1/s), " if pss else "")
                     + f"{worst:.0f} MB the largest process; the worst of every reported 10,000-page pipeline run "
                     "(throughput, re-parse, incremental)", verdict])
    else:
        rows.append(["peak RSS ≤ 300 MB at 10,000 pages", "not measured (quick run)", "—"])
    return rows


#: How far above the fastest crawler the server's ceiling must be to call it "not what bounds them".
CEILING_MARGIN = 3.0


def ceiling_note(results: dict) -> str:
    """Whether the server's ceiling is far above every crawler of the same size, from the figures."""
    close = []
    for size, res in results["sizes"].items():
        ceilings = [r["pages_per_s"] for r in res.get("ceiling", {}).values()]
        crawlers = [int(size) / pair[tool]["wall_s"] for pair in res.get("throughput", {}).values() for tool in pair]
        if ceilings and crawlers and min(ceilings) < CEILING_MARGIN * max(crawlers):
            close.append(f"{int(size):,} pages: ceiling {min(ceilings):,.0f} vs fastest crawler {max(crawlers):,.0f} pages/s")
    if close:
        return "**The server's ceiling is not far above the crawlers** (" + "; ".join(close) + "): it may bound them."
    return f"It is at least {CEILING_MARGIN:g}× every crawler below, so the server is not what bounds them."


def render(results: dict, analysis: Path | None = None) -> str:
    m = results["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `{results['invocation']}` ({results['mode']} run) on {results['started_at']} in "
        f"{results['duration_s'] / 60:.1f} min"
        + (f" (the sizes not re-run come from the run of {results['merged_from']}, `--merge`)" if results.get("merged_from") else "")
        + ". Do not edit by hand: the tables come from "
        "`benchmarks/.work/results.json`, the analysis from `benchmarks/analysis.md`. "
        "How to run and what each figure means: `benchmarks/README.md`.",
        "",
        "## Machine",
        "",
        f"- CPU: {m['cpu']}, {m['cores']} cores; memory {m['memory_gb']} GB; {m['os']}; Python {m['python']}",
        "- " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        f"- code: commit {m['commit']}" + (f" plus uncommitted changes in {len(m['dirty_files'])} file"
                                           f"{'s' if len(m['dirty_files']) > 1 else ''} ({', '.join(m['dirty_files'])})"
                                           if m["dirty_files"] else ""),
        *_code_notes(results),
        f"- pipeline source fingerprint `{results.get('code_at_start')}`"
        + ("" if results.get("code_at_start") == results.get("code_at_end") and
           len({r.get("code") for r in results["sizes"].values()}) <= 1
           else f" at the start, `{results.get('code_at_end')}` at the end: **the code changed during the run**; "
                "per size: " + ", ".join(f"{int(k):,} pages `{v.get('code')}`" for k, v in results["sizes"].items())),
        f"- server, crawler and pipeline share the {m['cores']} cores; the server runs in its own process (its CPU is in no figure below)",
        "",
        "## Targets",
        "",
        *_table(["target", "measured (same run)", "verdict"], targets(results)),
    ]
    for size, res in results["sizes"].items():
        s = res["server"]
        lines.append(f"- {int(size):,} pages: {res['categories']} categories × {res['pages_per_category']} listing pages, "
                     f"{res['categories'] * res['pages_per_category'] * 20:,} products, mean page {s['mean_page_bytes'] / 1000:.1f} KB "
                     f"({s['bytes'] / 1e6:.0f} MB in all)")
    lines += ["", "## Server ceiling", "",
              "The catalogue server answering `benchmarks/fast_client.py` (keep-alive, no parsing; best of the rounds). "
              + ceiling_note(results), ""]
    rows = [[f"{int(size):,}", c, _f(r["pages_per_s"], 0), _f(r["mb_per_s"], 0), r["rounds"]]
            for size, res in results["sizes"].items() for c, r in res.get("ceiling", {}).items()]
    lines += _table(["pages", "connections", "pages/s", "MB/s", "rounds"], rows)
    lines += ["## Throughput: fetch + store + parse + load", "",
              "Same pages, same per-host concurrency `c`. Wall time is the whole command (process start included); "
              "in-run excludes start-up (Scrapy: its `elapsed_time_seconds`; pipeline: Dagster's RUN_START→RUN_SUCCESS). "
              "CPU is user+system of the process and all its children. RSS: the largest single process, and the peak "
              "sum over the process tree (steps run in the command's own process, Dagster's in-process executor; the other processes are the fork workers of `parsed_products` and Dagster's compute-log helpers). "
              "The RSS sum counts the pages the fork workers share copy-on-write with the command once per process; "
              "PSS tree is the tree's peak proportional set size (each shared page counted once in all; read every ~1 s), "
              "what the whole tree really holds. Others' CPU: what other programs "
              "(other people's test suites on this shared machine) used meanwhile; each command waited for a quiet "
              "machine first (at most 1 min), so a large figure there means that row was slowed down by them. "
              "Ratio: ours/Scrapy pages/s, end to end, of the median runs. A row with several wall times in the last "
              "column is the run with the median wall time of that many runs (the concurrencies interleaved, round "
              "after round, Scrapy and pipeline alternating; the host's speed drifts by up to ~30% between identical "
              "runs with no CPU of other programs to see); at 10,000 pages Scrapy ran once per row (~1 min a run; its "
              "margin is not close).", ""]
    rows = throughput_rows(results)
    lines += _table(THROUGHPUT_HEADER, rows) + clock_note(rows)
    lines += ["Where the pipeline's wall time goes (seconds; `start + exit` = the command's time outside the run: process "
              "start, definitions, instance and run creation before RUN_START, interpreter shutdown after RUN_SUCCESS; "
              "`other` = in-run time outside the steps: run events between steps):", ""]
    rows = step_rows(results)
    lines += _table(["pages", "c", "wall", "start + exit", "raw_pages", "parsed_products", "products_table", "dead_letters", "other"],
                    rows) + clock_note(rows)
    lines += ["## Re-parse backfill", "",
              "Saved pages → validated rows → table: `--select parsed_products,products_table,dead_letters` over every "
              "category after a parse-rule change (the spec's `max_pages` changed, which changes every partition's input "
              "version as a `PARSER_VERSION` bump would), against `benchmarks/bare_parse.py` (a selectolax loop extracting "
              "the same fields from the same saved pages, nothing validated or written; only its loop is timed). With "
              "`--repeats` above 1, the two alternate that many rounds (each round changes the rules again, so each "
              "re-parses everything): each row is the round of ours with the median wall time against the bare loop's "
              "median round, every round's figures in the last two columns.", ""]
    rows = reparse_rows(results)
    lines += _table(["pages", "ours wall s", "ours pages/s", "parsed_products s", "step pages/s", "products_table s",
                     "CPU s", "RSS max MB", "HTTP requests", "others' CPU s", "bare pages/s", "ours/bare", "step/bare",
                     "ours wall s of each round", "bare pages/s of each round"], rows) + clock_note(rows)
    rows = [[f"{int(size):,}", *_step_cells(res["reparse"]["ours"])] for size, res in results["sizes"].items()
            if res.get("reparse")]
    if rows:
        lines += ["Where the re-parse's wall time goes (seconds, the median round; columns as in the throughput "
                  "section's step table; `raw_pages` is not selected):", ""]
        lines += _table(["pages", *STEP_HEADER], rows) + clock_note(rows)
    lines += ["## Incremental refresh", "",
              "The pipeline at c=16 on the same data directory: the first run (fresh), then a second run on the unchanged "
              "catalogue, a third on it with the spec's opt-in `incremental: {revalidate: first_page}` (page 1 unchanged: "
              "pages 2..N adopted without a request), a fourth with the opt-in `incremental: {revalidate: sitemap}` (the "
              "site's `sitemap.xml` read once; pages it dates no later than their saved copy adopted without a request; "
              "page 1 of each category revalidated as the check), then a fifth (default spec) after the server switched "
              "to a catalogue where every 10th category has new prices; last, after a run (default spec, not reported) "
              "back on the unchanged catalogue, the same change again with the sitemap opt-in. Requests and 304s as the "
              "server counted them (robots.txt and the sitemap "
              "included) and as `raw_pages` recorded them. The first run is the median c=16 run of the throughput table; "
              "each unchanged row is the median of the runs listed in its last column, one after the other on the same "
              "data (every one of them an unchanged day). RSS max and PSS tree: the worst of the runs a row stands "
              "for (the first run's: of every c=16 run of the throughput table), as the memory target counts them, "
              "not the median run's.", ""]
    rows = []
    for size, res in results["sizes"].items():
        inc = res.get("incremental")
        if not inc:
            continue
        first = inc["first"]
        runs = [("first run", first), ("unchanged", inc["unchanged"]),
                ("unchanged, `revalidate: first_page`", inc.get("unchanged_first_page")),
                ("unchanged, `revalidate: sitemap`", inc.get("unchanged_sitemap")),
                ("10% of categories changed", inc["changed_10pct"]),
                ("10% of categories changed, `revalidate: sitemap`", inc.get("changed_10pct_sitemap"))]
        for label, r in runs:
            if r is None:
                continue
            served = r.get("served", {})
            rows.append([f"{int(size):,}", label + _flag(r), served.get("requests"), served.get("status_304"), r.get("requests_made"),
                         r.get("pages_not_modified"), r.get("pages_assumed_unchanged") or 0, r.get("pages_parsed"),
                         r.get("partitions_reloaded"), _f(r["wall_s"]),
                         f"{r['wall_s'] / first['wall_s']:.0%}", _f(r["cpu_s"]),
                         _f(r.get("rss_max_process_mb_all_runs", r.get("rss_max_process_mb")), 0),
                         _f(r.get("pss_peak_tree_mb_all_runs", r.get("pss_peak_tree_mb")) or None, 0),
                         _f(r.get("foreign_cpu_s")), _runs(r)])
    lines += _table(["pages", "run", "requests (server)", "304s (server)", "requests_made", "pages_not_modified",
                     "pages adopted (no request)", "pages re-parsed", "partitions reloaded", "wall s", "of first", "CPU s",
                     "RSS max MB", "PSS tree MB", "others' CPU s", "wall s of each run"], rows)
    rows = []
    for size, res in results["sizes"].items():
        inc = res.get("incremental")
        if not inc:
            continue
        for label, key in (("first run", "first"), ("unchanged", "unchanged"),
                           ("unchanged, `revalidate: first_page`", "unchanged_first_page"),
                           ("unchanged, `revalidate: sitemap`", "unchanged_sitemap"),
                           ("10% of categories changed", "changed_10pct"),
                           ("10% of categories changed, `revalidate: sitemap`", "changed_10pct_sitemap")):
            if inc.get(key):
                rows.append([f"{int(size):,}", label, *_step_cells(inc[key])])
    if rows:
        lines += ["Where each incremental run's wall time goes (seconds; the median runs; columns as in the "
                  "throughput section's step table):", ""]
        lines += _table(["pages", "run", *STEP_HEADER], rows) + clock_note(rows)
    daily = results["sizes"].get("1000", {}).get("daily")
    if daily:
        one, per = daily["schedule"], daily["per_category"]
        lines += ["## Daily refresh of all categories", "",
                  "1,000 pages, 20 categories, c=16, each on a fresh data directory. The schedule's way: evaluate "
                  "`daily_scrape_schedule` and run its RunRequest (partition-range tags) with `dagster job execute` "
                  "(the daemon's run launcher adds one more process for the run worker). Against it: one "
                  "`dagster job execute --tags '{\"dagster/partition\": KEY}'` per category, one after the other."
                  + (f" Only {per['measured_runs']} of the {per['runs']} per-category runs were measured (quick run); their "
                     "totals are scaled up." if per.get("extrapolated") else ""), ""]
        lines += _table(["launch", "runs", "CLI launches", "Python processes started", "wall s", "CPU s", "RSS max MB",
                         "others' CPU s"], [
            ["schedule (one run, partition range)" + _flag(one), one["runs"], 1, one["python_processes"], _f(one["wall_s"]), _f(one["cpu_s"]),
             _f(one["rss_max_process_mb"], 0), _f(one.get("foreign_cpu_s"))],
            ["one run per category" + _flag(per), per["runs"], per["runs"], _f(per["python_processes"], 0), _f(per["wall_s"]), _f(per["cpu_s"]),
             _f(per["rss_max_process_mb"], 0), _f(per.get("foreign_cpu_s"))],
        ])
    prof = results["sizes"].get("1000", {}).get("profile")
    if prof and prof.get("txt", {}).get("ok") and Path(prof["txt"]["path"]).exists():  # re-read: the summary may have improved
        from benchmarks.profile_summary import summarize

        prof["summary"] = summarize(Path(prof["txt"]["path"]))
    if prof and prof.get("summary"):
        from benchmarks.profile_summary import to_markdown

        lines += ["## Profile of the pipeline (1,000 pages, c=16)", "",
                  f"`py-spy record --subprocesses` of the same command; flame graph: `{_rel(prof['svg']['path'])}`, "
                  f"raw stacks: `{_rel(prof['txt']['path'])}`. Sampling slows the run, so shares matter more than seconds.", "",
                  to_markdown(prof["summary"])]
    for size, res in results["sizes"].items():
        pu = res.get("incremental", {}).get("profile_unchanged")
        if not pu or not pu.get("ok") or not Path(pu["path"]).exists():
            continue
        from benchmarks.profile_summary import summarize, to_markdown

        lines += [f"## Profile of an unchanged day ({int(size):,} pages, default: every page revalidated, c=16)", "",
                  f"What bounds the target this scenario misses. `py-spy record --subprocesses --format raw` of one more "
                  f"unchanged run on the same data, right after the measured ones (not in their medians; "
                  f"{pu['wall_s']:.1f} s under the sampler); raw stacks: `{_rel(pu['path'])}`.", "",
                  to_markdown(summarize(Path(pu["path"])))]
    if analysis and analysis.exists():
        lines += analysis_lines(results, analysis.read_text())
    lines += ["## Commands", "", f"The whole run: `{results['invocation']}`. Every kind of command it ran, as first run "
              "(work directory `benchmarks/.work/`; the other sizes and concurrencies differ only in the values; the "
              "server's base URL is the one of its ready file). Before each pipeline command the runner creates its "
              "`DAGSTER_HOME` with a copy of the repository's `dagster.yaml` (`mkdir -p $DAGSTER_HOME && cp dagster.yaml "
              "$DAGSTER_HOME/`; Dagster refuses a missing one, and without the copy it runs on its stock storage):",
              "", "```sh"]
    lines += [f"# {what}\n{cmd}" for what, cmd in results.get("commands", [])]
    lines += ["```", ""]
    return "\n".join(lines)


ANALYSIS_MARK = re.compile(r"<!-- analysis of the run started (\S+) -->")


def analysis_lines(results: dict, text: str) -> list[str]:
    """The hand-written analysis (``benchmarks/analysis.md``), only in the report of the full run
    it was written for (its mark names that run's ``started_at``: another run of the same code
    measures other figures); otherwise a note that this run has none, so no report quotes
    figures of another run as its own."""
    written_for = ANALYSIS_MARK.search(text)
    if written_for and written_for.group(1) == results.get("started_at") and results.get("mode") == "full":
        return [ANALYSIS_MARK.sub("", text).strip(), ""]
    return ["## Analysis", "", f"`benchmarks/analysis.md` was written for another run (the full run started "
            f"{written_for.group(1) if written_for else '(not stated)'}); this {results.get('mode')} run, started "
            f"{results.get('started_at')}, has no hand-written analysis: its figures are the tables above.", ""]


def _code_notes(results: dict) -> list[str]:
    """Rows measured on another version of the pipeline than the run started with (someone edited it meanwhile)."""
    start = results.get("code_at_start")
    moved = []
    for size, res in results["sizes"].items():
        for c, pair in res.get("throughput", {}).items():
            if pair["ours"].get("code", start) != start:
                moved.append(f"{int(size):,} pages c={c}")
        for label in ("unchanged", "unchanged_first_page", "unchanged_sitemap", "changed_10pct", "changed_10pct_sitemap"):
            if res.get("incremental", {}).get(label, {}).get("code", start) != start:
                moved.append(f"{int(size):,} pages incremental {label}")
        if res.get("reparse", {}).get("ours", {}).get("code", start) != start:
            moved.append(f"{int(size):,} pages re-parse")
    return [f"- **measured on edited code** (fingerprint differs from the start): {', '.join(moved)}"] if moved else []


def _rel(path: str) -> str:
    marker = "/benchmarks/"
    return "benchmarks/" + path.split(marker, 1)[1] if marker in path else path


def summary_table(results: dict) -> str:
    lines = _table(THROUGHPUT_HEADER, throughput_rows(results))
    lines += _table(["target", "measured", "verdict"], targets(results))
    return "\n".join(lines)
