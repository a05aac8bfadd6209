"""Constructor arguments of every mechanism: a wrong type or range is a ValueError naming the
argument, raised before torch builds anything."""

import pytest

import attn_zoo as az

BASE = {  # name -> valid kwargs
    "standard": dict(d_model=16, n_heads=4),
    "relational": dict(d_model=16, n_heads=4),
    "dual": dict(d_model=16, n_heads_sa=2, n_heads_ra=2),
    "linear": dict(d_model=16, n_heads=4),
    "additive": dict(d_model=16, n_heads=4),
    "axial": dict(d_model=16, n_heads=4),
    "msa_row": dict(d_model=16, n_heads=4),
    "msa_column": dict(d_model=16, n_heads=4),
    "differential": dict(d_model=16, n_heads=4),
    "sigmoid": dict(d_model=16, n_heads=4),
    "softcapped": dict(d_model=16, n_heads=4),
    "gla": dict(d_model=16, n_heads=4),
}
NEW = ("differential", "sigmoid", "softcapped", "gla")
BAD = [  # (mechanisms, argument, value)
    (("standard", "relational", "linear", "additive", "axial", "msa_row", "msa_column", "dual",
      *NEW), "d_model", "16"),
    (("standard", "relational", "linear", "additive", "axial", "msa_row", "msa_column", "dual",
      *NEW), "d_model", 0),
    (("standard", "relational", "linear", "additive", "axial", "msa_row", "msa_column", *NEW),
     "n_heads", 4.0),
    (("standard", "relational", "linear", "additive", "axial", "msa_row", "msa_column", *NEW),
     "n_heads", True),
    (("standard", "relational", "axial", "msa_row", "msa_column", "dual", "softcapped"),
     "dropout", 1.5),
    (("standard", "relational", "linear", "differential", "sigmoid", "softcapped"),
     "n_kv_heads", 0),
    (("differential",), "layer", 0),
    (("sigmoid",), "bias", "0"),
    (("softcapped",), "cap", -1.0),
    (("gla",), "key_dim", 0),
    (("gla",), "gate_rank", 2.5),
    (("gla",), "tau", 0.0),
    (("relational",), "n_relations", "3"),
    (("dual",), "n_heads_ra", -1),
    (("axial",), "n_axes", 0),
]  # fmt: skip
CASES = [(m, arg, value) for names, arg, value in BAD for m in names]


def test_every_mechanism_is_covered():
    assert set(BASE) == set(az.list_mechanisms())


@pytest.mark.parametrize("mechanism, argument, value", CASES)
def test_a_bad_argument_is_named(mechanism, argument, value):
    assert argument in az.mechanism_kwargs(mechanism)
    az.build(mechanism, **BASE[mechanism])  # the valid kwargs build
    with pytest.raises(ValueError, match=f"^{argument}={value!r}: must be"):
        az.build(mechanism, **{**BASE[mechanism], argument: value})
