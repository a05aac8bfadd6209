"""What a plugin's code can change without a name in the config showing it is recorded or
declared: a plugin backend that outranks a built-in one (``auto`` may pick it for built-in
mechanisms) in each cell's environment and in the grid's status lines, the code and plugins a
resume checkpoint holds as the run's driver recorded them (workers run no git), and keyword
arguments a plugin mechanism takes out of **kwargs itself, declared by name."""

import contextlib
import functools
import io
import json

import pytest
import torch
from grids import STD, tiny_grid

import attn_zoo as az
from ablations.cli import main
from ablations.grid.plugins import import_plugins
from ablations.grid.spec import SpecError, load_grid
from ablations.results.store import ResultsStore
from ablations.run import train
from ablations.run.provenance import plugin_record, source_state
from ablations.run.runner import run_grid
from ablations.run.status import plugin_code
from attn_zoo.kernels.dispatch import family, plugin_backends_first, register_backend
from attn_zoo.mechanisms.registry import MECHANISMS

FAST = """
from attn_zoo.kernels.dispatch import family, register_backend

naive = family("softmax").backends["naive"]


@register_backend("softmax", "fast38", tier="naive", priority=1000,
                  capabilities=naive.capabilities)
def fast(**kwargs):
    return naive.fn(**kwargs)
"""


def test_a_plugin_backend_outranking_the_built_ins_is_recorded_and_named(tmp_path, monkeypatch):
    """The hostile pass: a plugin's new backend of priority 1000 served every built-in
    mechanism under `auto`, and nothing recorded it."""
    plugin = tmp_path / "fast38.py"
    plugin.write_text(FAST)
    grid = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training={"steps": 2, "eval_every": 2})
    grid.write_text(f'imports = ["{plugin}"]\n' + grid.read_text())
    softmax = family("softmax")  # the plugin registers into a copy, dropped after the test
    monkeypatch.setattr(softmax, "backends", dict(softmax.backends))
    spec = load_grid(grid)
    assert run_grid(spec, workers=1, out=io.StringIO())["done"] == 1
    (row,) = ResultsStore(spec.store, readonly=True).rows()
    assert row["environment"]["outranking"] == ["softmax backend fast38"]
    digest = plugin_record(spec.imports)[str(plugin)][:12]
    assert plugin_code(spec) == [
        f"plugins: fast38.py {digest}",
        "plugin backends outranking built-in ones (auto may pick them): softmax backend fast38",
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["ablate", "status", str(grid)]) == 0
    assert out.getvalue().splitlines()[-2:] == plugin_code(spec)  # `ablate status` names them


def checkpoint_inputs(data: bytes) -> dict:
    """The inputs a resume checkpoint's bytes hold (ablations/run/resume.py)."""
    from ablations.run.resume import MAGIC

    payload = io.BytesIO(data[len(MAGIC) + 32 :])
    return json.loads(torch.load(payload, weights_only=True)["inputs"])


def test_a_run_hands_its_workers_the_code_and_plugins_it_records(tmp_path, monkeypatch):
    """Each cell ran `source_state` (3 git processes) again in its worker; with one worker (a
    thread of the driver) its checkpoints held no plugins, so an edited plugin was resumed."""
    plugin = tmp_path / "quiet38.py"
    plugin.write_text("SCALE = 1.0\n")
    grid = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training={"steps": 4, "eval_every": 2})
    grid.write_text(f'imports = ["{plugin}"]\n' + grid.read_text())
    spec = load_grid(grid, ["resume.every_steps=2"])
    written = []
    monkeypatch.setattr(ResultsStore, "save_resume", lambda store, key, data: written.append(data))
    here = source_state()

    def no_git(*args):
        raise AssertionError("a worker ran git")

    monkeypatch.setattr(train, "source_state", no_git)
    assert run_grid(spec, workers=1, out=io.StringIO())["done"] == 1
    assert written and all(checkpoint_inputs(data)["code"] == here for data in written)
    assert checkpoint_inputs(written[0])["plugins"] == plugin_record(spec.imports) != {}


@pytest.fixture
def popped_kwarg():
    """Two plugin mechanisms whose __init__ pops "alpha" from **kwargs: one declaring it."""
    from attn_zoo.mechanisms.standard import StandardAttention

    def init(self, d_model, n_heads, **kwargs):
        alpha = kwargs.pop("alpha", 1.0)
        StandardAttention.__init__(self, d_model, n_heads, **kwargs)
        self.alpha = alpha

    az.register_mechanism("popped38")(
        type("Popped", (StandardAttention,), {"__init__": init, "extra_kwargs": ("alpha",)})
    )
    az.register_mechanism("undeclared38")(
        type("Undeclared", (StandardAttention,), {"__init__": init})
    )
    yield
    MECHANISMS.unregister("popped38")
    MECHANISMS.unregister("undeclared38")


def test_a_kwarg_a_plugin_pops_itself_is_accepted_once_declared(tmp_path, popped_kwarg):
    """The hostile pass: `kwargs.pop("alpha")` before super().__init__(**kwargs) was refused
    as an unknown kwarg, with no way to say otherwise."""
    assert az.build("popped38", d_model=8, n_heads=2, alpha=0.5).alpha == 0.5
    with pytest.raises(ValueError, match="'alph'. Did you mean 'alpha'"):
        az.build("popped38", d_model=8, n_heads=2, alph=0.5)  # a typo is still refused
    with pytest.raises(ValueError, match=r"declare it: extra_kwargs = \('alpha',\) in the class"):
        az.build("undeclared38", d_model=8, n_heads=2, alpha=0.5)
    mechanism = {"label": "p", "name": "popped38", "kwargs": {"n_heads": 2, "alpha": 0.5}}
    (cell,) = load_grid(tiny_grid(tmp_path, mechanisms=[mechanism], seeds=[0])).cells
    assert cell.mechanism_kwargs["alpha"] == 0.5
    typo = {**mechanism, "kwargs": {"n_heads": 2, "alpha_": 0.5}}
    with pytest.raises(SpecError, match="Did you mean 'alpha'"):
        load_grid(tiny_grid(tmp_path, mechanisms=[typo], seeds=[0]))


def test_a_declaration_that_is_not_a_tuple_of_names_is_refused(popped_kwarg):
    MECHANISMS["popped38"].extra_kwargs = "alpha"  # a string: its letters would be names
    with pytest.raises(TypeError, match=r"Popped.extra_kwargs = 'alpha': must be a tuple"):
        az.build("popped38", d_model=8, n_heads=2, alpha=0.5)


def test_a_plugin_backend_dressed_as_a_built_in_with_wraps_is_named_outranking():
    """The third hostile pass: functools.wraps(a built-in) copied its __module__ (attn_zoo...)
    onto the plugin's function, which then passed for built-in: nothing recorded it."""
    naive = family("softmax").backends["naive"]

    @functools.wraps(naive.fn)
    def dressed(**kwargs):
        return naive.fn(**kwargs)

    register_backend(
        "softmax", "dressed", tier="naive", priority=1000, capabilities=naive.capabilities
    )(dressed)
    assert "softmax backend dressed" in plugin_backends_first()


def test_a_module_a_plugin_package_imports_lazily_is_part_of_its_digest(tmp_path, monkeypatch):
    """The third hostile pass: a module the plugin imports only in eval mode was loaded after
    the digest was taken, so an edit of it after a kill still resumed the cell."""
    package = tmp_path / "lazy_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "later.py").write_text("FACTOR = 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import_plugins([package.name])
    before = plugin_record([package.name])
    (package / "later.py").write_text("FACTOR = 3.0\n")
    assert plugin_record([package.name]) != before
