"""A property-testing kit for attention kernels and mechanisms (needs hypothesis).

A kernel of your own against the float64 naive backend, on drawn problems:

    from hypothesis import given
    from attn_zoo.testing import attention_problems, assert_backends_agree

    @given(attention_problems())
    def test_my_kernel(problem):
        assert_backends_agree(problem, kernels={"mine": my_kernel})
"""

from attn_zoo.testing.agreement import (
    GRAD_TOLERANCE,
    OUTPUT_TOLERANCE,
    assert_backends_agree,
    compare,
)
from attn_zoo.testing.mechanisms import assert_mechanism_backends_agree, mechanism_lengths
from attn_zoo.testing.problems import (
    LAYOUTS,
    MASK_KINDS,
    MASK_MODS,
    SCORE_MODS,
    AttentionProblem,
    RelationalProblem,
    torch_threads,
)
from attn_zoo.testing.profiles import load_profile
from attn_zoo.testing.strategies import (
    ALL_MASK_MODS,
    ALL_SCORE_MODS,
    attention_problems,
    block_edges,
    lengths,
    relational_problems,
)

__all__ = [
    "ALL_MASK_MODS",
    "ALL_SCORE_MODS",
    "GRAD_TOLERANCE",
    "LAYOUTS",
    "MASK_KINDS",
    "MASK_MODS",
    "OUTPUT_TOLERANCE",
    "AttentionProblem",
    "RelationalProblem",
    "SCORE_MODS",
    "assert_backends_agree",
    "assert_mechanism_backends_agree",
    "attention_problems",
    "block_edges",
    "compare",
    "lengths",
    "load_profile",
    "mechanism_lengths",
    "relational_problems",
    "torch_threads",
]
