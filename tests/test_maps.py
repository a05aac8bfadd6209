"""Attention maps: recorded from the real forward pass, equal to the naive kernel's weights,
plotted, and kept for trained cells through checkpoints."""

import io

import matplotlib.image
import pytest
import torch

import attn_zoo as az
from ablations.attention import cell_attention_figure, load_cell_model
from ablations.report import write_report
from ablations.report_pages import label_file_name
from ablations.runner import run_grid
from ablations.spec import load_grid
from ablations.store import ResultsStore
from attn_zoo.kernels.relational.naive import relation_tensor
from attn_zoo.kernels.softmax.naive import attention_weights
from attn_zoo.maps import plot_attention_maps, record_attention_maps, recording_attention
from attn_zoo.models import LanguageModel


def test_standard_maps_are_the_weights_that_produce_the_output():
    torch.manual_seed(0)
    m = az.build("standard", d_model=16, n_heads=2, backend="naive").double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    (maps,) = record_attention_maps(m, x, is_causal=True).values()
    weights = maps["attention"]
    assert weights.shape == (2, 2, 5, 5)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 2, 5, dtype=torch.float64))
    assert torch.all(weights.triu(1) == 0)  # causal
    v = m.wv(x).view(2, 5, 2, 8).transpose(1, 2)
    heads = (weights @ v).transpose(1, 2).reshape(2, 5, 16)
    torch.testing.assert_close(m.wo(heads), m(x, is_causal=True), rtol=1e-10, atol=1e-10)


def test_dual_maps_have_both_branches_and_the_relations():
    torch.manual_seed(0)
    lm = LanguageModel(
        vocab_size=11, d_model=16, n_layers=2, attention="dual", max_block_size=8,
        attention_kwargs=dict(n_heads_sa=2, n_heads_ra=2, symbol_retrieval="positional_symbols",
                              symbol_retrieval_kwargs=dict(max_length=8)),
    )  # fmt: skip
    idx = torch.randint(11, (1, 6))
    lm.train()
    maps = record_attention_maps(lm, idx)
    assert lm.training  # mode restored
    assert set(maps) == {
        f"blocks.{i}.attn.{b}" for i in (0, 1) for b in ("self_attention", "relational_attention")
    }
    rel = maps["blocks.0.attn.relational_attention"]
    assert rel["attention"].shape == (1, 2, 6, 6) and rel["relations"].shape == (1, 2, 6, 6)
    assert torch.all(rel["attention"][0].triu(1) == 0)  # the LM's causal mask was seen

    module = lm.blocks[0].attn.relational_attention
    h = lm.blocks[0].norm1(lm.pos_enc(lm.token_embedder(idx)))
    q, k, qr, kr = module.projections(h, None)
    torch.testing.assert_close(rel["relations"], relation_tensor(qr, kr, module.rel_proj_dim**-0.5))
    torch.testing.assert_close(
        rel["attention"], attention_weights(q, k, None, True, module.head_dim**-0.5)
    )

    figure = plot_attention_maps(maps, labels=[str(int(t)) for t in idx[0]], title="t")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    image = matplotlib.image.imread(io.BytesIO(buffer.getvalue()), format="png")
    assert len(set(image.reshape(-1, image.shape[-1])[:, :3].sum(1).tolist())) > 10


def test_a_model_without_attention_maps_is_named():
    with (
        pytest.raises(ValueError, match="Linear has no module with attention_maps"),
        recording_attention(torch.nn.Linear(2, 2)),
    ):
        pass


GRID = """
name = "ck"
seeds = [3]
store = "{store}"
checkpoints = true
[[tasks]]
name = "same_pair"
kwargs = {{ n_train = 64, n_validation = 16, n_test = 16 }}
[[sizes]]
label = "xs"
d_model = 16
n_layers = 1
[[mechanisms]]
label = "dual"
name = "dual"
[mechanisms.kwargs]
n_heads_sa = 1
n_heads_ra = 1
symbol_retrieval = "positional_symbols"
symbol_retrieval_kwargs = {{ max_length = 2 }}
[training]
steps = 5
eval_every = 5
batch_size = 8
"""


def test_checkpointed_cells_reload_with_their_test_accuracy_and_draw_maps(tmp_path):
    path = tmp_path / "ck.toml"
    path.write_text(GRID.format(store=tmp_path / "ck.sqlite"))
    spec = load_grid(path)
    run_grid(spec, workers=1, out=io.StringIO())
    store = ResultsStore(spec.store)
    (row,) = store.rows()
    assert store.checkpoint_path(row["key"]).is_file()
    model, task = load_cell_model(store, row)
    test = task.splits(3)["test"]
    with torch.no_grad():
        logits, _ = model.eval()(test.inputs, test.targets)
    accuracy = (logits.argmax(-1) == test.targets).float().mean().item()
    assert accuracy == pytest.approx(row["metrics"]["test_acc"])
    figure = cell_attention_figure(store, row)
    assert len(figure.axes) >= 3

    report = write_report(store, tmp_path / "report", note="A conclusion.")
    text = (report / "report.md").read_text()
    assert "## Attention maps" in text and "A conclusion." in text
    maps = label_file_name("attention", ("same_pair", "xs", "dual"))
    assert f"({maps})" in text
    image = matplotlib.image.imread(report / maps)
    assert len(set(image.reshape(-1, image.shape[-1])[:, :3].sum(1).tolist())) > 10

    store.checkpoint_path(row["key"]).unlink()
    with pytest.raises(FileNotFoundError, match="checkpoints = true"):
        load_cell_model(store, row)
