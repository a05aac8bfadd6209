"""A property-testing kit for attention kernels and mechanisms (needs hypothesis).

A kernel of your own against the float64 naive backend, on drawn problems:

    from hypothesis import given
    from attn_zoo.testing import attention_problems, assert_backends_agree

    @given(attention_problems())
    def test_my_kernel(problem):
        assert_backends_agree(problem, kernels={"mine": my_kernel})

A mechanism of your own against its float64 naive path, masks drawn (key padding and per
query, boolean and additive):

    @given(mechanism_problems())
    def test_my_mechanism(problem):
        assert_mechanism_backends_agree("mine", {"d_model": 16, "n_heads": 2},
                                        **problem.arguments())
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
    MECHANISM_MASKS,
    SCORE_MODS,
    AttentionProblem,
    MechanismProblem,
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
    mechanism_problems,
    relational_problems,
)

__all__ = [
    "ALL_MASK_MODS",
    "ALL_SCORE_MODS",
    "GRAD_TOLERANCE",
    "LAYOUTS",
    "MASK_KINDS",
    "MASK_MODS",
    "MECHANISM_MASKS",
    "OUTPUT_TOLERANCE",
    "AttentionProblem",
    "MechanismProblem",
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
    "mechanism_problems",
    "relational_problems",
    "torch_threads",
]
