"""The base class of attention mechanisms: parameters live here, backends are a setting.

A mechanism is an ``nn.Module`` with ``forward(x, symbols=None, attn_mask=None,
is_causal=False) -> (B, N, D)`` and a ``backend`` attribute naming how its kernel runs. The
backend never changes the parameters, so one state_dict serves every backend.
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from attn_zoo.kernels.dispatch import family
from attn_zoo.registry import unknown_name_error


def check_int(name: str, value: object, low: int = 1, optional: bool = False) -> None:
    """ValueError naming `name` unless `value` is an int >= `low` (or None when `optional`);
    bools are not ints here."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        none = " or None" if optional else ""
        raise ValueError(f"{name}={value!r}: must be an integer >= {low}{none}")


def check_dropout(dropout: object) -> None:
    """ValueError unless 0 <= dropout < 1."""
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise ValueError(f"dropout={dropout!r}: must be a number in [0, 1)")


class AttentionMechanism(nn.Module):
    """Subclasses set `kernel_family` (the kernel they call) and call ``super().__init__(backend)``.

    Composite mechanisms (several kernels) override `backend_names` and `backend_status`.
    """

    kernel_family: ClassVar[str] = "softmax"
    # True: serves causal calls only (a recurrence over positions), so a model may put it only
    # where its blocks are causal (a LanguageModel, a Seq2Seq's decoder)
    causal_only: ClassVar[bool] = False
    # How many of a standard layer's heads one head of this mechanism stands for: attention
    # surgery (attn_zoo/interop/surgery.py) gives it a model's heads and key/value heads divided
    # by this, so its heads are as wide as the model's (differential: 2, one per softmax map)
    model_heads_per_head: ClassVar[int] = 1

    def __init__(self, backend: str = "auto"):
        super().__init__()
        self.backend = backend

    @classmethod
    def backend_names(cls) -> list[str]:
        """Every backend name this mechanism accepts, ``auto`` excluded."""
        return family(cls.kernel_family).names()

    @classmethod
    def backend_status(cls, backend: str, device: str = "cpu") -> tuple[bool, str]:
        """(ok, reason): can `backend` run this mechanism's plain float32 calls on `device`?"""
        cls.check_backend(backend)
        return family(cls.kernel_family).status(backend, device)

    @classmethod
    def check_backend(cls, backend: str) -> None:
        if backend != "auto" and backend not in cls.backend_names():
            raise unknown_name_error(
                f"backend for {cls.__name__}", backend, ["auto", *cls.backend_names()]
            )

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, name: str) -> None:
        """Set the backend; a composite mechanism passes the (tier) name on to its branches."""
        self.check_backend(name)
        self._backend = name
        for child in self.children():
            if isinstance(child, AttentionMechanism):
                child.backend = name

    def extra_repr(self) -> str:
        return f"backend={self.backend!r}"
