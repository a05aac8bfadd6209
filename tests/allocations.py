"""Memory probes for kernel tests: what a computation allocates, not how long it takes."""

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LargestAllocation(TorchDispatchMode):
    """Records the largest storage, in elements, of any tensor an op returns inside the block
    (views count by their storage, so an expanded view is not mistaken for an allocation)."""

    def __init__(self):
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                size = t.untyped_storage().nbytes() // t.element_size()
                self.elements = max(self.elements, size)
        return out


def largest_allocation(fn: Callable[[], object]) -> int:
    """Elements of the largest tensor storage created while running fn() (forward and any
    backward it runs)."""
    with LargestAllocation() as probe:
        fn()
    return probe.elements
