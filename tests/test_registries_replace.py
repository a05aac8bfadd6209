"""Every registry refuses a taken name unless the replacement is explicit, and records it; a
plugin mechanism whose __init__ passes **kwargs on has its kwargs checked by name like a
built-in one."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from grids import SAME_PAIR, XS, tiny_grid

import attn_zoo as az
from ablations.grid.spec import SpecError, load_grid
from attn_zoo.mechanisms.registry import mechanism_kwargs

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "sliding_window.py"


def python(code: str) -> subprocess.CompletedProcess:
    """`code` run by a fresh interpreter (registrations and the record are per process)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_every_registry_refuses_a_taken_name_and_records_an_explicit_replacement():
    result = python("""
        from dataclasses import dataclass

        import attn_zoo as az
        from ablations.tasks.registry import TASKS, register_task
        from ablations.tasks.same_pair import SamePair
        from attn_zoo.kernels.softmax.mods import MODS
        from attn_zoo.mechanisms.standard import StandardAttention
        from attn_zoo.registry import replaced_names
        from attn_zoo.symbols.registry import SYMBOL_RETRIEVERS, register_symbol_retriever

        class Mine(StandardAttention):
            pass

        @dataclass(frozen=True)
        class MyPairs(SamePair):
            pass

        retriever = SYMBOL_RETRIEVERS["position_relative"]
        calls = [
            (az.register_mechanism, "standard", Mine),
            (register_symbol_retriever, "position_relative", type("R", (retriever,), {})),
            (register_task, "same_pair", MyPairs),
            (lambda name, replace=False: MODS.register(name, replace=replace), "softcap",
             lambda cap: None),
        ]
        assert replaced_names() == []
        for register, name, entry in calls:
            try:
                register(name)(entry)
                raise SystemExit(f"{name}: a taken name was replaced silently")
            except ValueError as err:
                assert "already registered" in str(err) and "replace=True" in str(err), err
            assert register(name, replace=True)(entry) is entry
        assert az.mechanisms.registry.mechanism_class("standard") is Mine
        assert TASKS["same_pair"] is MyPairs
        az.register_mechanism("brand_new", replace=True)(Mine)  # nothing replaced: no record
        print(replaced_names())
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "[('mechanism', 'standard'), ('symbol_retrieval', 'position_relative'), "
        "('task', 'same_pair'), ('attention mod', 'softcap')]"
    )


def test_a_plugin_mechanism_passing_kwargs_on_gets_the_closest_valid_kwarg(example_plugin):
    """The example's __init__(d_model, n_heads, window=8, **kwargs) hands the rest to
    StandardAttention: a typo was a raw TypeError from StandardAttention.__init__."""
    with pytest.raises(ValueError, match="'windw'. Did you mean 'window'"):
        az.build("sliding_window", d_model=8, n_heads=2, windw=3)
    with pytest.raises(ValueError, match="'n_kv_head'. Did you mean 'n_kv_heads'"):
        az.build("sliding_window", d_model=8, n_heads=2, n_kv_head=1)
    assert az.build("sliding_window", d_model=8, n_heads=2, n_kv_heads=1, window=3).window == 3
    kwargs = mechanism_kwargs("sliding_window")
    assert kwargs[:3] == ["d_model", "n_heads", "window"] and "n_kv_heads" in kwargs
    assert len(kwargs) == len(set(kwargs))


def test_a_grid_with_a_typo_in_a_plugin_mechanisms_kwargs_names_the_closest_valid_one(
    tmp_path, example_plugin
):
    window = {"label": "w", "name": "sliding_window", "kwargs": {"n_heads": 2, "windw": 4}}
    grid = tiny_grid(tmp_path, tasks=[SAME_PAIR], sizes=[XS], seeds=[0], mechanisms=[window])
    with pytest.raises(SpecError, match=r"kwargs.windw .* Did you mean 'window'\? Valid: n_heads"):
        load_grid(grid, imports=[str(EXAMPLE)])
