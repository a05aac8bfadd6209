"""N = 0: every mechanism on every backend that serves the call gives an empty output and
empty gradients (a backend that cannot is refused by its capabilities, and `auto` avoids it)."""

import pytest
import torch

import attn_zoo as az
from attn_zoo.kernels import UnsupportedCallError

KWARGS = {
    "standard": dict(n_heads=2),
    "linear": dict(n_heads=2),
    "additive": dict(n_heads=2),
    "differential": dict(n_heads=2),
    "sigmoid": dict(n_heads=2),
    "softcapped": dict(n_heads=2),
    "gla": dict(n_heads=2),
    "axial": dict(n_heads=2, n_axes=1),
    "msa_row": dict(n_heads=2),
    "msa_column": dict(n_heads=2),
    "relational": dict(n_heads=2, symbol_retrieval="positional_symbols",
                       symbol_retrieval_kwargs=dict(max_length=8)),
    "dual": dict(n_heads_sa=1, n_heads_ra=1, symbol_retrieval="positional_symbols",
                 symbol_retrieval_kwargs=dict(max_length=8)),
}  # fmt: skip
CASES = [(m, b) for m in sorted(KWARGS) for b in ["auto", *az.list_backends(m)]]


def test_every_mechanism_is_covered():
    assert set(KWARGS) == set(az.list_mechanisms())


@pytest.mark.parametrize("mechanism, backend", CASES)
def test_an_empty_sequence_gives_an_empty_output(mechanism, backend):
    m = az.build(mechanism, d_model=8, backend=backend, **KWARGS[mechanism])
    shape = (2, 3, 0, 8) if mechanism.startswith("msa") else (2, 0, 8)
    x = torch.randn(shape, requires_grad=True)
    causal = mechanism in ("standard", "linear", "additive", "relational", "dual", "differential",
                           "sigmoid", "softcapped", "gla")  # fmt: skip
    try:
        y = m(x, is_causal=causal)
    except UnsupportedCallError as err:  # refused by capabilities (device, no backward, ...)
        assert backend != "auto", err
        return
    assert y.shape == shape
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == shape
