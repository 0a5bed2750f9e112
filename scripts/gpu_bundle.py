"""A wheelhouse for an air-gapped GPU node: `make gpu-bundle` writes dist/gpu-bundle/.

The node has a CUDA build of torch, transformers and accelerate installed (a CUDA image) and no
network. The bundle holds prunelab's wheel and what the node lacks for `prunelab-gpu-check` and a
plain run (`tracking=none`, a perplexity evaluation, offline data), for CPython 3.12 on x86-64
Linux, in under 64 MiB:

- BUNDLED dependencies of pyproject, with their own dependencies (resolved by pip for 3.12);
- minus what the node has: torch, transformers and accelerate and everything they depend on (read
  from this environment's installed metadata, the same libraries a node image installs);
- LEFT_OUT: the dependencies no check imports, too large together for the bundle (each with its
  reason; measured sizes beside it). A run that needs them needs a networked install.

Every dependency of pyproject must be in one of NODE, BUNDLED and LEFT_OUT: a new one fails here
until it is placed. Sdist-only pure-Python packages (antlr4, hydra's parser runtime) are built into
wheels here. On the node (README, "Checking a GPU node"):

    pip install --no-index --no-deps gpu-bundle/*.whl
    prunelab-gpu-check
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 64 * 1024**2
#: What the node image has: these and their installed dependencies.
NODE = ("torch", "transformers", "accelerate")
#: pyproject dependencies the check and a plain run import: into the bundle.
BUNDLED = ("hydra-core", "omegaconf", "hydra-submitit-launcher", "scipy", "tabulate")
#: pyproject dependencies left out, and why.
LEFT_OUT = {
    "wandb": "W&B tracking (tracking=none on the node); its wheel alone is about a third of the limit",
    "lm-eval": "zero-shot evaluation; brings datasets, pyarrow, scikit-learn, sacrebleu, nltk",
    "datasets": "hub corpora (c4, wikitext2; the node is offline); brings pyarrow",
    "pandas": "aggregation and tables (prunelab aggregate): run them where the records are copied to",
    "statsmodels": "paired tests of aggregation",
    "matplotlib": "plots of aggregation",
    "gguf": "reading GGUF checkpoints (smollm2_135m's packaged one); not a GPU node's model",
}
#: Measured (cp312, manylinux x86-64): the bundle 47.0 MiB (scipy 33.7, prunelab 12.8); the left-out
#: wheels alone 122 MiB (pyarrow 52.5, wandb 19.4, statsmodels 11.5, pandas 11.5, matplotlib 9.4,
#: lm-eval 8.7, scikit-learn 8.7), their own dependencies not counted.
#: Pure-Python packages published as sdists only: built into wheels before pip resolves.
SDIST_ONLY = ("antlr4-python3-runtime==4.9.3",)
TARGET = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
          "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
          "--platform", "manylinux_2_28_x86_64", "--only-binary=:all:"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"], check=True)


def project_dependencies() -> dict[str, str]:
    """canonical name -> requirement string, from pyproject's [project] dependencies."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {canonical(Requirement(spec).name): spec for spec in project["dependencies"]}


def installed_closure(roots: tuple[str, ...]) -> set[str]:
    """Canonical names of `roots` and every installed distribution they depend on (markers
    evaluated here, no extras): what a node with `roots` installed has."""
    seen: set[str] = set()
    todo = [canonical(root) for root in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for spec in requires:
            requirement = Requirement(spec)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonical(requirement.name))
    return seen


def wheel_project(path: Path) -> str:
    return canonical(path.name.split("-")[0])


def check_classified(dependencies: dict[str, str], node: set[str]) -> None:
    placed = node | {canonical(n) for n in BUNDLED} | {canonical(n) for n in LEFT_OUT}
    unplaced = sorted(set(dependencies) - placed)
    if unplaced:
        sys.exit(f"gpu-bundle: pyproject dependencies {', '.join(unplaced)} are in none of NODE's closure, "
                 "BUNDLED and LEFT_OUT (scripts/gpu_bundle.py): place them")


def build(out: Path) -> list[Path]:
    """Write the bundle's wheels into `out`; returns them."""
    dependencies = project_dependencies()
    node = installed_closure(NODE)
    check_classified(dependencies, node)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as staging:
        pip("wheel", "--no-deps", "--wheel-dir", str(out), str(REPO))
        pip("wheel", "--no-deps", "--wheel-dir", staging, *SDIST_ONLY)
        pip("download", *TARGET, "--find-links", staging, "--dest", staging,
            *[dependencies[canonical(name)] for name in BUNDLED])
        for wheel in sorted(Path(staging).glob("*.whl")):
            if wheel_project(wheel) not in node:
                shutil.copy2(wheel, out / wheel.name)
    return sorted(out.glob("*.whl"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist" / "gpu-bundle")
    args = parser.parse_args()
    wheels = build(args.out)
    total = sum(wheel.stat().st_size for wheel in wheels)
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 1024**2:8.2f} MiB  {wheel.name}")
    print(f"{total / 1024**2:8.2f} MiB  in {len(wheels)} wheels: {args.out} (limit {LIMIT_BYTES // 1024**2} MiB)")
    print("left out: " + "; ".join(f"{name} ({why})" for name, why in LEFT_OUT.items()))
    print(f"on the node: pip install --no-index --no-deps {args.out.name}/*.whl && prunelab-gpu-check")
    if total > LIMIT_BYTES:
        print(f"gpu-bundle: {total / 1024**2:.1f} MiB is over the limit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
