"""What model to load and how: the typed form of the `model` config group."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prunelab.errors import ConfigError

DTYPES = ("float32", "float16", "bfloat16", "auto")

# Models the project trains and ships itself (see prunelab.testbed); addressed by name like a hub id.
SHIPPED_ROOT = Path(__file__).resolve().parent.parent / "testbed" / "checkpoints"
SHIPPED_MODELS = ("testbed_llama", "testbed_pythia")


@dataclass(frozen=True)
class ModelSpec:
    """A causal LM to load with `from_pretrained`.

    Attributes:
        name_or_path: hub id (``meta-llama/Llama-2-7b-hf``), a local directory, or the name of a
            shipped testbed model (``testbed_llama``).
        label: short name for tables and W&B (defaults to the last path component).
        revision: hub branch, tag or commit (Pythia: ``step143000``); for a local directory, a
            subfolder of that name when one exists (the shipped testbed checkpoints use this).
        dtype: float32 | float16 | bfloat16 | auto. On CPU use float32 (bf16 is very slow there).
        device: where computation runs: auto | cpu | cuda | cuda:N.
        device_map: passed to ``from_pretrained`` for multi-GPU placement (``auto``); null keeps the
            whole model on ``device``.
        max_memory: with ``device_map``, accelerate's per-device budget (``{0: "20GiB", cpu:
            "60GiB"}``): what does not fit is offloaded to the CPU, then to disk, and every check,
            count and layer-by-layer pass reads it there (`models.offloaded_weights`).
        offload_folder: where disk-offloaded weights go (a fresh folder under the cache when null).
        trust_remote_code: off unless the user asks for it.
        tokenizer: optional tokenizer source when it differs from the model's.
        gguf_file: a GGUF checkpoint to read (a file name inside `name_or_path`, which may then be
            ``pkg:<package>``, ``installed:<name>`` (the GGUF files `prunelab install-data --models`
            puts in the cache), a local folder or a hub repository; or a path to the file). It is
            dequantized and converted once into a Hugging Face folder in the cache
            (`prunelab.models.gguf`), then loaded from there like any other model.
        streaming: false (the whole model in memory) | true | auto. Streamed, the decoder layers
            stay in the safetensors shards and every layer-sequential pass reads one at a time
            (`prunelab.models.streaming`): a model larger than memory prunes and evaluates with
            the same results, bit for bit. `auto` streams when the run's estimated peak exceeds
            `runtime.memory_budget_gb` (or the detected limit). Not part of the run's signature.
    """

    name_or_path: str
    label: str | None = None
    revision: str | None = None
    dtype: str = "float32"
    device: str = "auto"
    device_map: Any = None
    max_memory: Any = None
    offload_folder: str | None = None
    trust_remote_code: bool = False
    tokenizer: str | None = None
    gguf_file: str | None = None
    streaming: bool | str = False

    def __post_init__(self) -> None:
        if self.streaming not in (True, False, "auto"):
            raise ConfigError(f"model.streaming={self.streaming!r}: use true, false or auto")
        if not self.name_or_path:
            raise ConfigError("model.name_or_path is empty")
        if self.dtype not in DTYPES:
            raise ConfigError(f"model.dtype={self.dtype!r} is not one of {', '.join(DTYPES)}")
        if not (self.device in ("auto", "cpu", "mps") or self.device.startswith("cuda")):
            raise ConfigError(f"model.device={self.device!r}: use auto, cpu, cuda or cuda:N")
        if self.name_or_path.startswith("pkg:") and not self.gguf_file:
            raise ConfigError("model.name_or_path=pkg:<package> names a GGUF's folder: set model.gguf_file")
        if self.name_or_path.startswith("installed:") and not self.gguf_file:
            raise ConfigError("model.name_or_path=installed:<name> names a GGUF installed by "
                              "`prunelab install-data --models`: set model.gguf_file")
        if self.is_local_path and not Path(self.name_or_path).expanduser().exists():
            raise ConfigError(f"model path does not exist: {self.name_or_path}")
        if self.is_shipped and not (SHIPPED_ROOT / self.name_or_path).exists():
            raise ConfigError(
                f"shipped model {self.name_or_path!r} is missing from {SHIPPED_ROOT}; "
                "rebuild it with `python -m prunelab.testbed.train`"
            )
        tokenizer = self.tokenizer or ""
        if tokenizer.startswith(("/", "./", "../", "~")) and not Path(tokenizer).expanduser().exists():
            raise ConfigError(f"tokenizer path does not exist: {tokenizer}")
        if (self.is_shipped or self.is_local_path) and not self.gguf_file:
            self.resolved_source()  # a missing revision subfolder fails here, before loading

    @property
    def is_shipped(self) -> bool:
        return self.name_or_path in SHIPPED_MODELS

    @property
    def is_local_path(self) -> bool:
        """Paths are written as paths (absolute, ./, ../, ~); anything else may be a hub id."""
        p = self.name_or_path
        return p.startswith(("/", "./", "../", "~")) or Path(p).exists()

    @property
    def display_name(self) -> str:
        return self.label or Path(self.name_or_path.rstrip("/")).name

    def resolved_source(self) -> tuple[str, str | None]:
        """(what to pass to from_pretrained, revision to pass) after mapping names and subfolders."""
        if self.is_shipped:
            root = SHIPPED_ROOT / self.name_or_path
        elif self.is_local_path:
            root = Path(self.name_or_path).expanduser()
        else:
            return self.name_or_path, self.revision
        if self.revision and (root / self.revision).is_dir():
            return str(root / self.revision), None
        if self.revision and self.is_shipped:
            available = sorted(p.name for p in root.iterdir() if p.is_dir())
            raise ConfigError(
                f"{self.name_or_path} has no revision {self.revision!r}; available: {', '.join(available)}"
            )
        if not (root / "config.json").exists():
            subdirs = sorted(p.name for p in root.iterdir() if (p / "config.json").exists())
            if subdirs:  # a folder of checkpoints: the last one is the final model
                return str(root / _latest(subdirs)), None
        return str(root), None


def _latest(names: list[str]) -> str:
    """The checkpoint with the highest trailing number (step0 < step1000 < step143000)."""
    import re

    def step(name: str) -> int:
        m = re.search(r"(\d+)$", name)
        return int(m.group(1)) if m else -1

    return max(names, key=step)
