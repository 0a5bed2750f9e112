"""Layer-wise sparsity allocation: how a target sparsity is spread over the decoder layers."""

from prunelab.allocation.base import Allocation
from prunelab.allocation.uniform import Uniform

__all__ = ["Allocation", "Uniform"]
