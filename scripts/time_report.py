"""Where the time of `make test` went: a table per stage and one per chapter.

Reads what the last `make test` left in _build: the tests' report (pytest's JUnit XML, which
holds every test's duration and the session's), the book build's record and its log (the
time myst-nb took to execute each chapter). Durations are wall-clock seconds measured while
the other jobs ran beside them (pytest-xdist's processes and the build share the cores), so
they add up to more than the session took.

    python scripts/time_report.py [_build]
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

EXECUTED = re.compile(r"(\S+\.md): Executed notebook in ([0-9.]+) seconds")


def test_times(report: Path) -> tuple[float, dict[str, float]]:
    """(the session's seconds, seconds per test file or chapter) from a JUnit XML report."""
    root = ElementTree.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    per_file: dict[str, float] = defaultdict(float)
    for case in suite.iter("testcase"):
        name = case.get("classname", "")
        # "book.generation.decoding.md" -> book/generation/decoding.md; "tests.test_x" -> .py
        path = name[:-3].replace(".", "/") + ".md" if name.endswith(".md") else (
            name.replace(".", "/") + ".py")
        per_file[path] += float(case.get("time", 0))
    return float(suite.get("time", 0)), dict(per_file)


def build_times(log: Path, root: Path) -> dict[str, float]:
    """Seconds myst-nb took to execute each chapter in the book build."""
    times = {}
    for match in EXECUTED.finditer(log.read_text(encoding="utf-8", errors="replace")):
        path = Path(match.group(1))
        times[str(path.relative_to(root)) if path.is_absolute() else str(path)] = float(
            match.group(2))
    return times


def main(build: Path) -> int:
    report, record_file, log = (build / "test-report.xml", build / "book-build.json",
                                build / "book-build.log")
    if not report.exists():
        print(f"no test report in {build} (make test writes one)")
        return 0
    session, per_file = test_times(report)
    record = json.loads(record_file.read_text()) if record_file.exists() else {}
    built = build_times(log, build.parent.resolve()) if log.exists() else {}
    chapters = {p: t for p, t in per_file.items() if p.endswith(".md")}
    browser = {p: t for p, t in per_file.items() if p.startswith("tests/test_browser")}
    units = {p: t for p, t in per_file.items() if p not in chapters and p not in browser}
    print("\nWhere the time of make test went (wall-clock seconds, jobs running side by side)")
    print("\n| stage | seconds |\n|---|---:|")
    print(f"| the whole pytest session | {session:.0f} |")
    if record.get("seconds"):
        print(f"| the book build (every chapter executed, pages written) "
              f"| {record['seconds']:.0f} |")
    print(f"| unit and parity tests ({len(units)} files) | {sum(units.values()):.0f} |")
    print(f"| chapters under nbval ({len(chapters)}) | {sum(chapters.values()):.0f} |")
    print(f"| chapters in the book build ({len(built)}) | {sum(built.values()):.0f} |")
    print(f"| browser tests of the built pages | {sum(browser.values()):.0f} |")
    print("\n| chapter | nbval | book build |\n|---|---:|---:|")
    for path in sorted(set(chapters) | set(built), key=lambda p: -chapters.get(p, 0)):
        nbval = f"{chapters[path]:.0f}" if path in chapters else "-"
        build_s = f"{built[path]:.0f}" if path in built else "-"
        print(f"| {path} | {nbval} | {build_s} |")
    slowest = sorted(units.items(), key=lambda kv: -kv[1])[:8]
    print("\n| slowest test files | seconds |\n|---|---:|")
    for path, seconds in slowest:
        print(f"| {path} | {seconds:.0f} |")
    print_failures(report)
    return 0


def print_failures(report: Path, limit: int = 30) -> None:
    """The failed and erroring tests, last, so that the tail of a CI log names them."""
    root = ElementTree.parse(report).getroot()
    failed = []
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            for problem in case.findall(kind):
                message = (problem.get("message") or problem.text or "").strip()
                first = message.splitlines()[0][:300] if message else ""
                failed.append(f"{kind}: {case.get('classname', '')}::{case.get('name', '')}"
                              f" -- {first}")
    if not failed:
        return
    print(f"\n{len(failed)} test(s) failed or errored:")
    for line in failed[:limit]:
        print(f"  {line}")
    if len(failed) > limit:
        print(f"  ... and {len(failed) - limit} more (see the pytest summary above)")


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("_build")))
