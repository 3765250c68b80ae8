"""The Markdown documents' in-page and file links point at something that exists."""

import re

import pytest

from scrape_assets_tests.conftest import REPO_ROOT

DOCUMENTS = ["README.md", "BENCHMARKS.md", "RELIABILITY.md", "benchmarks/README.md"]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("name", DOCUMENTS)
def test_links_point_at_headings_and_files_that_exist(name):
    path = REPO_ROOT / name
    text = path.read_text()
    outside_code = re.sub(r"```.*?```", "", text, flags=re.S)
    anchors = {github_anchor(line.lstrip("#")) for line in outside_code.splitlines() if line.startswith("#")}
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", outside_code):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        if file_part and not (path.parent / file_part).exists():
            broken.append(target)
        elif not file_part and anchor not in anchors:
            broken.append(target)
    assert not broken, f"{name}: links to nothing: {broken}"


def test_readme_has_a_contents_line_naming_every_section():
    text = (REPO_ROOT / "README.md").read_text()
    contents = next(line for line in text.split("\n\n") if line.startswith("Contents:"))
    sections = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert all(f"(#{github_anchor(s)})" in contents for s in sections), sections


def test_the_readme_spec_example_loads(tmp_path):
    """The spec a newcomer copies from "Adding a site" is one the pipeline accepts, as written."""
    from scrape_assets.spec import load_spec

    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("## Adding a site"):]
    example = re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1)
    (tmp_path / "my_shop.yaml").write_text(example)
    spec = load_spec(str(tmp_path / "my_shop.yaml"))
    assert (spec.name, list(spec.categories), spec.decimal_mark) == ("my_shop", ["travel"], ",")
    assert (spec.selectors.availability.css, spec.selectors.availability.attr) == ("p.availability", None)


def test_options_the_readme_gives_dagster_asset_materialize_exist():
    """Every ``--option`` in a ``dagster asset materialize`` command of the README (a code
    span, or a code block's command with its continuation lines) is one the command takes:
    a copied command must not stop at "No such option"."""
    import subprocess
    import sys
    from pathlib import Path

    text = (REPO_ROOT / "README.md").read_text().replace("\\\n", " ")
    commands = re.findall(r"dagster asset materialize([^`\n]*)", re.sub(r"`\s*\n\s*", "` ", text))
    # A code span broken across lines (fenced blocks left out: their commands end at their line, found above).
    spans = re.sub(r"```.*?```", "", text, flags=re.DOTALL).replace("\n", " ")
    commands += re.findall(r"dagster asset materialize([^`]*?)`", spans)
    used = {option for command in commands for option in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", command)}
    assert {"--select", "--partition", "--partition-range"} <= used  # the README's commands were found
    dagster = Path(sys.executable).with_name("dagster")
    help_text = subprocess.run([str(dagster), "asset", "materialize", "--help"], capture_output=True, text=True,
                               timeout=120, check=True).stdout
    taken = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", help_text))
    assert used <= taken, f"not options of dagster asset materialize: {sorted(used - taken)}"


def test_the_runbooks_daily_run_tags_are_the_schedules_kind():
    """The runbook's `dagster job launch --tags` is valid JSON selecting a range, queued with
    the daily runs (scrape/day, max runtime) but not under a date the schedule checks."""
    import json

    from scrape_assets.defs.jobs import QUEUE_TAG, partition_range_tags, queue_tags

    text = (REPO_ROOT / "README.md").read_text()
    runbook = text[text.index("## Runbook"):text.index("## What it builds")]
    raw = re.search(r"--tags\s+'(\{.*?\})'", runbook, re.DOTALL).group(1)
    tags = json.loads(" ".join(raw.split()))
    assert tags == {**partition_range_tags("FIRST", "LAST"), **queue_tags("manual")}
    assert not re.fullmatch(r"\d{4}-\d{2}-\d{2}", tags[QUEUE_TAG])
