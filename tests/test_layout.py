"""The repository's layout and the package's layers.

- The Hydra configs live in `conf/` at the top and nowhere else, and are the package
  `prunelab.conf` (so the editable install and the wheel find the same files).
- pyproject lists every package under src/ (it lists them, since `prunelab.conf` is mapped from
  outside src/).
- The import-linter contract in pyproject holds, and fails when an upward import is put back.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

#: The upward imports the layers forbid (issue 28): (module file under src/prunelab, import line).
UPWARD_IMPORTS = {
    "tracking/wandb_tracker.py": "from prunelab.analysis.plots import plot_matrix",
    "config.py": "from prunelab.pipeline import run",
    "cluster/launcher.py": "from prunelab.pipeline import run",
    "data/sources.py": "from prunelab.testbed import corpus",
}


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_configs_live_in_conf_at_the_top_and_nowhere_else():
    from prunelab.config import PACKAGE_CONF

    assert PACKAGE_CONF == REPO / "conf"
    groups = {p.name for p in (REPO / "conf").iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert {"model", "data", "pruning", "recovery", "evaluation", "tracking", "experiment", "sweep",
            "hydra"} <= groups
    config_files = [p for p in (REPO / "src").rglob("config.yaml")]
    assert config_files == [], f"configs outside conf/: {config_files}"
    assert not (REPO / "src" / "prunelab" / "conf").exists()


def test_pyproject_lists_every_package_and_maps_conf():
    setuptools = _pyproject()["tool"]["setuptools"]
    found = {str(p.parent.relative_to(REPO / "src")).replace("/", ".")
             for p in (REPO / "src").rglob("__init__.py") if "egg-info" not in str(p)}
    # hydra_plugins is a namespace package (no __init__.py): listed so that the editable install
    # gives it a real folder, which Hydra's plugin scan walks.
    assert set(setuptools["packages"]) == found | {"prunelab.conf", "hydra_plugins"}
    assert setuptools["package-dir"]["prunelab.conf"] == "conf"


def _lint(src: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), str(REPO / "pyproject.toml"), "--no-cache"],
                          cwd=cwd, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


def test_the_layers_hold():
    result = _lint(REPO / "src", REPO)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("module", sorted(UPWARD_IMPORTS))
def test_an_upward_import_put_back_breaks_the_layers(tmp_path, module):
    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "prunelab", src / "prunelab",
                    ignore=shutil.ignore_patterns("__pycache__", "checkpoints"))
    planted = src / "prunelab" / module
    planted.write_text(planted.read_text() + f"\n\ndef _planted():\n    {UPWARD_IMPORTS[module]}\n")
    result = _lint(src, tmp_path)
    importer = "prunelab." + module.removesuffix(".py").replace("/", ".")
    assert result.returncode != 0, result.stdout
    assert "prunelab layers BROKEN" in result.stdout and importer in result.stdout, result.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
@pytest.mark.parametrize("model", ["", "smollm2", "qwen25"])
def test_make_study_runs_the_experiment_of_each_part_and_model(tmp_path, model):
    """`make study STUDY=wrp MODEL=qwen25` runs experiment wrp_qwen25 (the shell loop's variable
    must not swallow the model suffix), then aggregates into results/wrp/qwen25 (commands faked)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "calls"
    for name in ("prunelab", "prunelab-aggregate", "python"):
        (bin_ / name).write_text(f"#!/bin/sh\necho {name} \"$@\" >> {calls}\n")
        (bin_ / name).chmod(0o755)
    (tmp_path / ".prunelab-installed").touch()  # the venv counts as set up
    result = subprocess.run(["make", "-s", "-C", str(REPO), f"VENV={tmp_path}", "STUDY=wrp", "study"]
                            + ([f"MODEL={model}"] if model else []), capture_output=True, text=True)
    lines = calls.read_text().splitlines() if calls.exists() else []
    assert result.returncode == 0 and lines, result.stderr
    suffix = f"_{model}" if model else ""
    assert lines[0].split()[:2] == ["prunelab", f"experiment=wrp{suffix}"]
    aggregate = lines[1].split()
    assert aggregate[0] == "prunelab-aggregate" and f"results/wrp{'/' + model if model else ''}" in aggregate
    if model:  # the backbones share results/wrp/records: each table reads its own model's records
        assert aggregate[1:4] == ["results/wrp/records", "--where", f"model={model}*"]
