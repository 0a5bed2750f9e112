"""What every check of `prunelab-gpu-check` shares: the device, the sizes (full on a GPU, small for
`--quick` and the CPU), the shipped testbed with its calibration and test tokens (read once), and
a work folder for saved models."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import torch

from prunelab.gpu_check.shapes import Shape, shape


@dataclass(frozen=True)
class Sizes:
    """How big each check runs: (sequences, tokens) of calibration and the shapes' size."""

    family_tokens: tuple[int, int]  # (a): each family on the testbed
    compare_tokens: tuple[int, int]  # (b), (e): the testbed's calibration for a comparison
    eval_seqlen: int  # (b), (e): perplexity windows of the testbed's test split...
    eval_windows: int  # ...and how many
    streamed_tokens: tuple[int, int]  # (c): the 1B shape's calibration
    paper_tokens: tuple[int, int]  # (f): the 7B shape's calibration (the papers' 128 x 2048)
    shrink_shapes: bool  # the 1B and 7B shapes shrunk (shapes.SHRUNK): the CPU and --quick


#: One H100/H200-class GPU: the whole check in about 5 minutes (most of it SparseGPT on the 7B shape).
FULL = Sizes(family_tokens=(8, 128), compare_tokens=(32, 256), eval_seqlen=256, eval_windows=16,
             streamed_tokens=(32, 512), paper_tokens=(128, 2048), shrink_shapes=False)
#: --quick (CI on 2 CPU cores: under 3 minutes): the same checks, small.
QUICK = Sizes(family_tokens=(4, 32), compare_tokens=(8, 64), eval_seqlen=128, eval_windows=4,
              streamed_tokens=(4, 64), paper_tokens=(8, 128), shrink_shapes=True)
#: The CPU without --quick: the testbed at full size, the shapes shrunk (a 7B in float32 on a CPU
#: is not a check of anything this command is for).
CPU_FULL = replace(FULL, paper_tokens=(32, 512), shrink_shapes=True)


def sizes_for(device: torch.device, quick: bool) -> Sizes:
    if quick:
        return QUICK
    return FULL if device.type == "cuda" else CPU_FULL


class Testbed:
    """The shipped testbed model (a trained Llama: its perplexity means something), its
    tokenizer, calibration windows of its train text and its test tokens."""

    def __init__(self, sizes: Sizes):
        from transformers import AutoTokenizer

        from prunelab.api import shipped_model

        self.path = shipped_model("testbed_llama")
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.sizes = sizes

    def model(self, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype).to(device).eval()

    def calibration(self, nsamples: int, seqlen: int) -> torch.Tensor:
        """[nsamples, seqlen] windows of the testbed's train text, seed 0: the same on every device."""
        from prunelab.data import CalibrationSpec, calibration_samples

        return calibration_samples(CalibrationSpec("testbed", nsamples, seqlen), self.tokenizer, seed=0)

    @cached_property
    def test_ids(self) -> torch.Tensor:
        """[1, L] the testbed's test split, tokenized once."""
        from prunelab.data import eval_token_stream

        return eval_token_stream("testbed", self.tokenizer, self.sizes.eval_seqlen)

    def perplexity(self, model: torch.nn.Module) -> float:
        from prunelab.gpu_check.measure import perplexity

        return perplexity(model, self.test_ids, self.sizes.eval_seqlen, self.sizes.eval_windows)


@dataclass
class CheckContext:
    device: torch.device
    sizes: Sizes
    testbed: Testbed
    work_dir: Path  # saved random models (removed when the command ends)
    families: list[str]  # names of gpu_check.families.METHOD_FAMILIES to run in check (a)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def shape_dtype(self) -> torch.dtype:
        """The shapes' dtype: float16 on a GPU (the papers'), float32 on the CPU (PITFALLS: no fast
        half precision on these CPUs)."""
        return torch.float16 if self.on_gpu else torch.float32

    def shape(self, name: str) -> Shape:
        return shape(name, shrunk=self.sizes.shrink_shapes)
