"""Safetensors checkpoints read one tensor at a time and written one shard at a time.

Reading uses plain file reads into a fresh buffer rather than `safetensors.safe_open`: that
returns views into a private memory map of the whole shard, so masking a weight in place copies
its pages into anonymous memory that counts against the process's limit and is never returned.
A read here costs exactly the tensor's bytes and frees them when the tensor is dropped.

The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length,
a JSON header `{name: {"dtype", "shape", "data_offsets": [begin, end]}}` (offsets relative to the
end of the header), then the data. A sharded checkpoint adds `model.safetensors.index.json`
(`{"metadata": ..., "weight_map": {name: file}}`), which `from_pretrained` follows.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from prunelab.errors import ModelCheckError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
           "U8": torch.uint8, "BOOL": torch.bool}


@dataclass(frozen=True)
class TensorLocation:
    """Where one tensor's bytes lie: file, byte range, dtype and shape."""

    file: Path
    start: int  # absolute offset in the file
    end: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(file: Path) -> dict[str, TensorLocation]:
    """name -> location of every tensor in one safetensors file (the header only is read)."""
    with open(file, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    base = 8 + length
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        try:
            dtype = _DTYPES[entry["dtype"]]
        except KeyError:
            raise ModelCheckError(f"{file}: tensor {name} has unsupported dtype {entry['dtype']}") from None
        out[name] = TensorLocation(file, base + begin, base + end, dtype, tuple(entry["shape"]))
    return out


def checkpoint_tensors(folder: str | Path) -> dict[str, TensorLocation]:
    """name -> location of every tensor of a Hugging Face folder (sharded with an index, or one
    file). Raises ModelCheckError when the folder holds no safetensors weights."""
    folder = Path(folder)
    if (folder / INDEX_FILE).exists():
        weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (folder / SINGLE_FILE).exists():
        files = [SINGLE_FILE]
    else:
        raise ModelCheckError(f"{folder} has no {SINGLE_FILE} or {INDEX_FILE}: streaming reads "
                              "safetensors checkpoints (save the model with safe_serialization=True)")
    out: dict[str, TensorLocation] = {}
    for name in files:
        out.update(read_header(folder / name))
    return out


def read_tensor(location: TensorLocation, device: torch.device | str = "cpu") -> torch.Tensor:
    """The tensor at `location`, read into its own buffer (never a memory map)."""
    tensor = torch.empty(location.shape, dtype=location.dtype)
    if location.nbytes:
        view = tensor.view(-1).view(torch.uint8).numpy()  # the buffer, as bytes
        with open(location.file, "rb", buffering=0) as handle:
            handle.seek(location.start)
            done = 0
            while done < location.nbytes:
                got = handle.readinto(memoryview(view)[done:])
                if not got:
                    raise ModelCheckError(f"{location.file} is truncated (reading {location.nbytes} bytes "
                                          f"at {location.start})")
                done += got
    return tensor if torch.device(device).type == "cpu" else tensor.to(device)


_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


def write_shard(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """One safetensors shard, written to a temporary name then renamed (no half-written shard).

    Each tensor's bytes go to the file from its own buffer: `safetensors.torch.save_file` first
    copies every tensor into a bytes object, which doubles the memory a shard needs."""
    tensors = {name: t.detach().cpu() for name, t in tensors.items()}
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format aligns the data to 8 bytes
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for tensor in tensors.values():
            if tensor.numel():
                flat = tensor.contiguous().view(-1).view(torch.uint8)  # a copy only if strided
                handle.write(memoryview(flat.numpy()))
    tmp.replace(path)


def write_index(folder: Path, weight_map: dict[str, str], total_bytes: int) -> None:
    """`model.safetensors.index.json` naming the shard of every tensor."""
    index = {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
