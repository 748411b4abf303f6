"""The Dockerfile: linted with hadolint, and its install steps run here (no Docker engine) to
show they give working entrypoints in a fresh venv that needs no writable path."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def test_hadolint_is_clean() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    proc = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_runtime_stage_is_non_root_numeric_and_runs_an_entrypoint() -> None:
    steps = instructions()
    assert sum(1 for k, _ in steps if k == "FROM") == 2, "multi-stage: build, then runtime"
    runtime = steps[[i for i, (k, _) in enumerate(steps) if k == "FROM"][-1] :]
    users = [v for k, v in runtime if k == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*:[1-9]\d*", users[-1]), users
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    entrypoint = [v for k, v in runtime if k == "ENTRYPOINT"][-1]
    assert entrypoint.strip('[]"') in scripts
    assert {"quorum-operator", "quorum-webhooks"} <= set(scripts)


def test_install_steps_give_working_entrypoints(tmp_path: Path) -> None:
    """Run the build stage's RUN steps with its paths moved under tmp_path."""
    src, dist, venv = tmp_path / "src", tmp_path / "dist", tmp_path / "opt-quorum"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "quorum", src / "quorum", ignore=shutil.ignore_patterns("__pycache__"))
    steps = instructions()
    first, second = [i for i, (k, _) in enumerate(steps) if k == "FROM"][:2]
    build_stage = steps[first:second]
    runs = [v for k, v in build_stage if k == "RUN"]
    assert runs, "the build stage installs with RUN"
    python_bin = Path(sys.executable).resolve().parent  # a plain interpreter, like the image's
    env = {**os.environ, "PATH": f"{python_bin}:{os.environ['PATH']}", "PIP_NO_INPUT": "1"}
    env.pop("PYTHONPATH", None)
    for command in runs:
        command = command.replace("/opt/quorum", str(venv)).replace("/dist", str(dist))
        proc = subprocess.run(
            ["bash", "-c", command], cwd=src, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    before = sorted(p for p in venv.rglob("*"))
    run_env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": str(tmp_path / "nohome"),
    }
    for script in ("quorum-operator", "quorum-webhooks", "quorum", "kubectl-quorum"):
        proc = subprocess.run(
            [str(venv / "bin" / script), "--version"],
            capture_output=True,
            text=True,
            env=run_env,
            cwd=tmp_path,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert re.search(r"\b0\.\d+\.\d+", proc.stdout), proc.stdout
    # What runs in a cluster, and nothing else: no dev tool, no pip to install more at run time.
    proc = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.util as u; print([m for m in ('devcluster', 'tests', 'pip', 'setuptools')"
            " if u.find_spec(m)])",
        ],
        capture_output=True,
        text=True,
        env=run_env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
    # Nothing was written into the install: a read-only root filesystem is fine.
    assert sorted(p for p in venv.rglob("*")) == before
