"""Recorded processes: stopped exactly, never a stranger that reused a PID."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from devcluster.process import ProcessRecord, is_alive, spawn, stop


def test_spawn_records_a_live_process_and_stop_ends_it(tmp_path: Path) -> None:
    record = spawn("sleeper", ["sleep", "60"], tmp_path / "log", tmp_path)
    assert is_alive(record)
    assert stop([record], grace_seconds=5) == []
    assert not is_alive(record)


def test_a_process_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    log = tmp_path / "log"
    record = spawn("stubborn", ["sh", "-c", "trap '' TERM; echo ready; sleep 60"], log, tmp_path)
    deadline = time.monotonic() + 5
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stop([record], grace_seconds=0.5) == ["stubborn"]
    assert not is_alive(record)


def test_a_reused_pid_is_not_ours_and_is_left_alone(tmp_path: Path) -> None:
    real = spawn("other", ["sleep", "60"], tmp_path / "log", tmp_path)
    try:
        impostor = ProcessRecord("ours", real.pid, real.start_ticks + 1)
        assert not is_alive(impostor)
        stop([impostor], grace_seconds=0.5)
        assert is_alive(real)
    finally:
        os.kill(real.pid, signal.SIGKILL)
        stop([real], grace_seconds=1)
