"""One import namespace (issues 11 and 18.6): the distribution installs nothing at the top level
but ``bucketsearch``; a user's own ``app`` package does not shadow ours; the public face."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_holds_only_bucketsearch(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("bucketsearch-*.whl"))
    top = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in top if not t.endswith(".dist-info")} == {"bucketsearch"}
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("bucketsearch/index/probe.py", "bucketsearch/app/main.py",
                   "bucketsearch/loadtest/cli.py", "bucketsearch/index/metrics/ramap.py"):
        assert module in names


def test_a_users_own_app_package_does_not_shadow_ours(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("MINE = True\n")
    code = ("import app; from bucketsearch.app.encode import results_binary; "
            "import bucketsearch; print(app.MINE, bucketsearch.__version__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("True ")


def test_public_face_and_one_version():
    code = ("import bucketsearch, importlib.metadata as m; "
            "from bucketsearch import HammingIndex, MultiIndex, LinearScan, AutoIndex, "
            "make_index, SearchStats; "
            "from index import HammingIndex as H2, make_index as mk2; "
            "assert H2 is HammingIndex and mk2 is make_index; "
            "assert bucketsearch.__version__ == m.version('bucketsearch'); "
            "from bucketsearch.app.main import create_app; "
            "assert create_app().version == bucketsearch.__version__; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    for cli in ("bucketsearch", "bucketsearch-loadtest"):
        exe = Path(sys.executable).with_name(cli)
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip().endswith(
            subprocess.run([sys.executable, "-c", "import bucketsearch; "
                            "print(bucketsearch.__version__)"], capture_output=True,
                           text=True).stdout.strip())
