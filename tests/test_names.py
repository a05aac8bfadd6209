"""One registry type for everything built by name; one block configuration; moved paths."""

import pytest
import torch
from torch import nn

from ablations.tasks.registry import TASKS
from attn_zoo.kernels.dispatch import FAMILIES
from attn_zoo.mechanisms.registry import MECHANISMS
from attn_zoo.models import BlockConfig, LanguageModel, SequenceClassifier
from attn_zoo.models.norms import NORMS
from attn_zoo.models.positional import POSITIONAL
from attn_zoo.registry import Registry
from attn_zoo.symbols import SYMBOL_RETRIEVERS


def test_every_registry_is_one_type():
    for registry in (MECHANISMS, FAMILIES, SYMBOL_RETRIEVERS, POSITIONAL, NORMS, TASKS):
        assert isinstance(registry, Registry), registry
        assert len(registry) > 1


def test_register_build_list_describe():
    shapes = Registry("shape", base=nn.Module)

    @shapes.register("square")
    class Square(nn.Module):
        """A square of side `side`."""

        def __init__(self, side: int, scale: float = 1.0):
            super().__init__()
            self.side, self.scale = side, scale

    assert shapes.names() == ["square"] and "square" in shapes
    assert shapes.build("square", side=3, scale=2.0).scale == 2.0
    assert shapes.describe("square") == "square: A square of side `side`.\n  kwargs: side, scale"
    with pytest.raises(ValueError, match="unknown keyword argument of shape 'square': 'scal'.*"
                       "Did you mean 'scale'"):  # fmt: skip
        shapes.build("square", side=3, scal=2.0)
    with pytest.raises(ValueError, match="unknown shape: 'sqare'. Did you mean 'square'"):
        shapes.build("sqare", side=3)
    with pytest.raises(ValueError, match="already registered"):
        shapes.register("square", Square)
    with pytest.raises(TypeError, match="must subclass Module"):
        shapes.register("circle", int)
    assert shapes.unregister("square") is Square and shapes.names() == []


def test_kwargs_are_checked_with_the_argument_they_came_in():
    import attn_zoo as az

    with pytest.raises(
        ValueError, match="key of sa_kwargs \\(mechanism 'standard'\\): 'n_kv_head'"
    ):
        az.build("dual", d_model=8, n_heads_sa=1, n_heads_ra=1, sa_kwargs={"n_kv_head": 1})
    with pytest.raises(ValueError, match="key of symbol_retrieval_kwargs.*'max_len'"):
        az.build(
            "relational", d_model=8, n_heads=2, symbol_retrieval="positional_symbols",
            symbol_retrieval_kwargs={"max_len": 4},
        )  # fmt: skip


def test_a_config_and_its_fields_build_the_same_model():
    settings = dict(
        d_model=16, attention="dual", dff=24, activation="swiglu", norm_type="rmsnorm",
        attention_kwargs=dict(n_heads_sa=1, n_heads_ra=1), symbol_retrieval="positional_symbols",
        symbol_retrieval_kwargs=dict(max_length=8),
    )  # fmt: skip
    torch.manual_seed(0)
    by_kwargs = SequenceClassifier(vocab_size=9, num_classes=2, n_layers=2, max_len=8, **settings)
    torch.manual_seed(0)
    config = BlockConfig(**settings)
    by_config = SequenceClassifier(
        vocab_size=9, num_classes=2, n_layers=2, max_len=8, config=config
    )
    a, b = by_kwargs.state_dict(), by_config.state_dict()
    assert list(a) == list(b)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    assert by_config.config == config
    assert LanguageModel(vocab_size=9, n_layers=1, config=config).config.causal


@pytest.mark.parametrize(
    "settings, match",
    [
        (dict(d_model=0), "d_model=0: must be an integer >= 1"),
        (dict(d_model="32"), "d_model='32'"),
        (dict(d_model=8, dff=0), "dff=0"),
        (dict(d_model=8, dropout=1.5), "dropout=1.5"),
        (dict(d_model=8, norm_frist=False), "unknown block setting.*Did you mean 'norm_first'"),
    ],
)
def test_block_settings_are_checked(settings, match):
    with pytest.raises(ValueError, match=match):
        LanguageModel(vocab_size=9, n_layers=1, **settings)


def test_n_layers_is_checked():
    with pytest.raises(ValueError, match="n_layers=0: must be an integer >= 1"):
        LanguageModel(vocab_size=9, d_model=8, n_layers=0)
