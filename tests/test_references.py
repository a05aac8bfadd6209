"""Reference models in a grid (ablations.grid.references): a [[mechanisms]] entry naming the
dual-attention package's VisionTransformer or VisionDualAttnTransformer trains that model on
the same data and seeds, built from the task and the cell's size as ours is; bad entries are
refused before any work."""

import importlib

import pytest
import torch
from dual_attention.vision_models import VisionDualAttnTransformer, VisionTransformer
from grids import assert_refused, tiny_grid

from ablations.grid.references import WithLoss, build_reference
from ablations.grid.spec import load_grid
from ablations.results.store import ResultsStore
from ablations.run.runner import run_grid
from ablations.tasks import build_task

GAMES = {
    "label": "games",
    "name": "relational_games",
    "kwargs": {"problem": "occurs", "cell_size": 5, "n_train": 32, "n_validation": 16,
               "n_test": 16},
}  # fmt: skip
SIZE = {"label": "xs", "d_model": 16, "n_layers": 2, "activation": "swiglu", "bias": False,
        "pool": "mean", "dropout": 0.1}  # fmt: skip
REF_VIT = {"label": "ref_vit", "name": "dual_attention.VisionTransformer", "kwargs": {"n_heads": 2}}
REF_DAT = {
    "label": "ref_dat",
    "name": "dual_attention.VisionDualAttnTransformer",
    "kwargs": {"n_heads_sa": 1, "n_heads_ra": 1, "symbol_retrieval": "positional_symbols",
               "ra_kwargs": {"symmetric_rels": True}},
}  # fmt: skip
OURS = {"label": "std", "name": "standard", "kwargs": {"n_heads": 2}}


def test_a_grid_trains_reference_models_beside_ours_on_the_same_data(tmp_path):
    path = tiny_grid(
        tmp_path, seeds=[0], tasks=[GAMES], sizes=[SIZE], mechanisms=[OURS, REF_VIT, REF_DAT],
        training={"steps": 4, "eval_every": 2, "batch_size": 8, "betas": [0.9, 0.99]},
    )  # fmt: skip
    spec = load_grid(path)
    run_grid(spec, workers=1)
    frame = ResultsStore(spec.store).to_dataframe().set_index("mechanism")
    assert set(frame.status) == {"done"}
    for mechanism in ("std", "ref_vit", "ref_dat"):
        assert 0 <= frame.loc[mechanism, "metrics.test_ood_acc"] <= 1
    assert frame.loc["ref_dat", "mechanism_name"] == REF_DAT["name"]


def test_the_reference_is_built_from_the_task_and_the_cells_size():
    task = build_task("relational_games", **GAMES["kwargs"])  # 15 x 15 images, 5 x 5 patches
    model = build_reference(REF_DAT["name"], task, SIZE, REF_DAT["kwargs"])
    assert isinstance(model, WithLoss) and isinstance(model.model, VisionDualAttnTransformer)
    ref = model.model
    assert len(ref.encoder_blocks) == 2 and ref.pool == "mean" and ref.dropout.p == 0.1
    # the retriever's width and length filled in: d_model, and 9 patches + cls
    assert ref.symbol_retriever.symbol_library.weight.shape == (10, 16)
    block = ref.encoder_blocks[0]
    assert block.ff_block.linear1.weight.shape == (int(8 * 16 / 3), 16)  # swiglu's default dff
    assert block.ff_block.linear1.bias is None  # bias = false
    relational = block.dual_attn.relational_attention
    assert relational.wq_rel is relational.wk_rel  # symmetric relations, from the kwargs
    images, labels = task.generate(3, torch.Generator().manual_seed(0))
    logits, loss = model(images, labels)
    assert logits.shape == (3, 2)
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(logits, labels))
    vit = build_reference(REF_VIT["name"], task, {**SIZE, "dff": 24}, {"n_heads": 4}).model
    assert isinstance(vit, VisionTransformer)
    assert vit.encoder_blocks[0].ff_block.linear1.weight.shape == (24, 16)


@pytest.mark.parametrize(
    ("mechanism", "task", "fragments"),
    [
        ({**REF_VIT, "kwargs": {"n_head": 2}}, GAMES,
         ["mechanisms[0].kwargs.n_head (key)", "n_heads"]),
        ({**REF_VIT, "name": "dual_attention.VisionTransformr"}, GAMES,
         ["mechanisms[0].name = 'dual_attention.VisionTransformr'",
          "Did you mean 'dual_attention.VisionTransformer'"]),
        (REF_VIT, {"name": "same_pair", "kwargs": {"n_train": 32}},
         ["'ref_vit'", "trains image_classification tasks, not classification"]),
        ({**REF_VIT, "kwargs": {"n_heads": 3}}, GAMES, ["'ref_vit'", "cannot be built"]),
    ],
)  # fmt: skip
def test_bad_reference_entries_are_refused_before_any_work(tmp_path, mechanism, task, fragments):
    path = tiny_grid(tmp_path, seeds=[0], tasks=[task], sizes=[SIZE], mechanisms=[mechanism])
    assert_refused(path, fragments)
    assert not (tmp_path / "tiny.sqlite").exists()


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch):
    real = importlib.import_module

    def missing(name, *args):
        if name.startswith("dual_attention"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", missing)
    task = build_task("relational_games", **GAMES["kwargs"])
    with pytest.raises(ImportError, match=r"not installed: pip install dual-attention==0\.0\.7"):
        build_reference(REF_VIT["name"], task, SIZE, REF_VIT["kwargs"])


def test_final_norm_false_builds_our_model_as_the_reference_would(tmp_path):
    from ablations.grid.cell_model import build_cell_model
    from attn_zoo.interop.dual_attention_models import VisionDualAttnTransformer as Builder

    dual = {"label": "dual", "name": "dual", "kwargs": {"n_heads_sa": 1, "n_heads_ra": 1}}
    size = {**SIZE, "final_norm": False, "dff": 24, "symbol_retrieval": "positional_symbols",
            "symbol_retrieval_kwargs": {"max_length": 10}}  # fmt: skip
    path = tiny_grid(tmp_path, seeds=[0], tasks=[GAMES], sizes=[size], mechanisms=[dual])
    (cell,) = load_grid(path).cells
    task = build_task("relational_games", **GAMES["kwargs"])
    torch.manual_seed(0)
    ours = build_cell_model(cell, task).eval()
    torch.manual_seed(0)
    built = Builder((3, 15, 15), (5, 5), 2, 16, 2, 1, 1, 24, 0.1, "swiglu", True,
                    "positional_symbols", {"max_length": 10}, bias=False, pool="mean")  # fmt: skip
    built.eval()
    images, _ = task.generate(3, torch.Generator().manual_seed(1))
    torch.testing.assert_close(ours(images)[0], built(images)[0])
    refused = tiny_grid(tmp_path, seeds=[0], tasks=[GAMES], mechanisms=[REF_VIT],
                        sizes=[{**SIZE, "final_norm": True}], file="ref.toml")  # fmt: skip
    assert_refused(refused, ["'ref_vit'", "no final norm: final_norm=True cannot apply"])
    no_skip = {**SIZE, "attention_residual": False}
    bottleneck = tiny_grid(tmp_path, seeds=[0], tasks=[GAMES], mechanisms=[REF_VIT],
                           sizes=[no_skip], file="res.toml")  # fmt: skip
    assert_refused(bottleneck, ["'ref_vit'", "residual around attention: attention_residual=False"])
