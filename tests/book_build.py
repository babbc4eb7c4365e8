"""The book build that `make test` runs beside the tests, shared by every pytest process.

The build executes every chapter under the build's numeric configuration (tests/numerics.py)
with scripts/build_book.py, several chapters at a time. It starts as soon as the tests that
read the built pages are collected and runs beside the rest of the tests, so that on a 2-core
machine the work overlaps; those tests run last and wait for it. Under pytest-xdist every
worker collects the same tests: the first to ask starts the build, and each waits for the
record the build leaves when it ends (its exit code, tagged with the test run it belongs to).

Run as `python -m tests.book_build RUN_ID` it is that build: the book, then the record.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.numerics import BUILD_NUMERICS, with_numerics

ROOT = Path(__file__).resolve().parent.parent
# The book is built into $TFBOOK_OUTPUT/_build (default: the repository), with the table of
# contents $TFBOOK_TOC (default: _toc.yml): lets a chapter in progress be built on its own.
OUTPUT = Path(os.environ.get("TFBOOK_OUTPUT", ROOT))
TOC = Path(os.environ.get("TFBOOK_TOC", ROOT / "_toc.yml"))
BUILD = OUTPUT / "_build"
HTML = BUILD / "html"
LOG = BUILD / "book-build.log"
RECORD = BUILD / "book-build.json"  # {"run": run id, "pid", "code": exit code or None, "seconds"}


def build_command() -> list[str]:
    """The whole book built, every chapter executed, warnings as errors (as `make book`)."""
    return [sys.executable, str(ROOT / "scripts" / "build_book.py"), "build", "--all", "-W",
            "-n", "--keep-going", "--path-output", str(OUTPUT), "--toc", str(TOC), str(ROOT)]


def build_environment() -> dict[str, str]:
    """The book build runs under its own numeric configuration (tests/numerics.py)."""
    return with_numerics(os.environ, BUILD_NUMERICS)


def _read_record() -> dict:
    try:
        return json.loads(RECORD.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_record(record: dict) -> None:
    partial = RECORD.with_suffix(".partial")
    partial.write_text(json.dumps(record), encoding="utf-8")
    partial.replace(RECORD)  # atomic: a reader sees the old record or the new one


def start(run_id: str) -> bool:
    """Start the build for this test run unless a process of the run already did; True if new."""
    BUILD.mkdir(parents=True, exist_ok=True)
    claim = BUILD / f"book-build.{run_id}.claim"
    try:  # the first process of the run to create the claim starts the build
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    for old in BUILD.glob("book-build.*.claim"):  # claims of earlier runs
        if old != claim:
            old.unlink(missing_ok=True)
    _write_record({"run": run_id, "pid": None, "code": None})
    # Its own session: a pytest-xdist worker may end before the build does.
    process = subprocess.Popen([sys.executable, "-m", "tests.book_build", run_id], cwd=ROOT,
                               env=build_environment(), start_new_session=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    _write_record({"run": run_id, "pid": process.pid, "code": None})
    return True


def wait(run_id: str, poll_seconds: float = 1.0) -> tuple[int, str]:
    """Wait until this run's build has ended: (exit code, the end of its log)."""
    while True:
        record = _read_record()
        if record.get("run") == run_id and record.get("code") is not None:
            output = LOG.read_text(encoding="utf-8", errors="replace") if LOG.exists() else ""
            return int(record["code"]), output[-9000:]
        if record.get("run") != run_id and not (BUILD / f"book-build.{run_id}.claim").exists():
            return 1, f"no book build was started for this test run ({run_id})"
        time.sleep(poll_seconds)


def stop(run_id: str) -> None:
    """Stop this run's build if it still runs (the test session ended early)."""
    record = _read_record()
    if record.get("run") == run_id and record.get("code") is None and record.get("pid"):
        try:
            os.killpg(record["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass


def main(run_id: str) -> int:
    start = time.time()
    with open(LOG, "w", encoding="utf-8") as log:
        code = subprocess.call(build_command(), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    _write_record({"run": run_id, "pid": os.getpid(), "code": code, "started": start,
                   "seconds": round(time.time() - start, 1)})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
