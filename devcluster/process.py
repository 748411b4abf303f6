"""Background processes that outlive the command that started them, recorded by PID.

A PID alone can be reused by an unrelated process after ours exits, so each record also keeps
the process's start time (field 22 of /proc/<pid>/stat); `stop` only signals a PID whose start
time still matches, and so never kills a stranger.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int

    def to_json(self) -> dict[str, int | str]:
        return {"name": self.name, "pid": self.pid, "start_ticks": self.start_ticks}


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a live PID, None if there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def is_alive(record: ProcessRecord) -> bool:
    stat = _stat(record.pid)
    if stat is None:
        return False
    state, ticks = stat
    if ticks != record.start_ticks:
        return False  # the PID now belongs to someone else
    if state in ("Z", "X"):
        _reap(record.pid)
        return False
    return True


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our own child (else init reaps it)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def spawn(
    name: str, argv: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None
) -> ProcessRecord:
    """Start argv in its own session (so it survives our exit and our terminal's signals)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            env=env,
        )
    stat = _stat(proc.pid)
    return ProcessRecord(name, proc.pid, stat[1] if stat else -1)


def stop(records: list[ProcessRecord], grace_seconds: float = 10.0) -> list[str]:
    """Stop the records one by one in reverse start order (so the apiserver shuts down while
    etcd still answers): SIGTERM, then SIGKILL after the grace period. Returns the names of
    processes that had to be killed."""
    killed = []
    for record in reversed(records):
        if not is_alive(record):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGTERM)
        if _wait_dead(record, grace_seconds):
            continue
        killed.append(record.name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGKILL)
        _wait_dead(record, 5.0)
    return killed


def _wait_dead(record: ProcessRecord, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while is_alive(record):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {path})"
