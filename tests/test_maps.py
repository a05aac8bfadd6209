"""Attention maps: recorded from the real forward pass, equal to the naive kernel's weights,
plotted, and recorded for trained cells when they finish (grids with checkpoints), so that
reports draw them without running a model."""

import io
import json
from pathlib import Path

import matplotlib.image
import pytest
import torch
from grids import SAME_PAIR, STD, small, tiny_grid, with_heads
from torch.nn.modules.module import register_module_forward_pre_hook

import ablations.run.train
import attn_zoo as az
from ablations.grid.cell_model import load_cell_model
from ablations.grid.spec import load_grid
from ablations.report.attention_maps import (
    MapsError,
    attention_blocks,
    cell_attention_figure,
    load_cell_maps,
)
from ablations.report.build import write_report
from ablations.report.pages import label_file_name
from ablations.results.cells_file import read_attention
from ablations.results.store import ResultsStore
from ablations.run.runner import run_grid
from ablations.run.train import MAPS_EXAMPLE, attention_record
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


def test_each_row_of_maps_is_drawn_on_a_scale_that_covers_its_values():
    torch.manual_seed(0)
    differential = LanguageModel(
        vocab_size=11, d_model=16, n_layers=1, attention="differential",
        attention_kwargs=dict(n_heads=2), max_block_size=12,
    )  # fmt: skip
    with torch.no_grad():
        for p in differential.parameters():
            p.mul_(3)  # sharper maps: softmax1 - lambda softmax2 goes below 0
    idx = torch.randint(11, (1, 8))
    (signed,) = record_attention_maps(differential, idx).values()
    standard = LanguageModel(
        vocab_size=11, d_model=16, n_layers=1, attention_kwargs=dict(n_heads=2), max_block_size=12
    )
    (weights,) = record_attention_maps(standard, idx).values()
    maps = {"differential": signed, "standard": weights}
    assert signed["attention"].min() < 0  # the case drawn wrongly on a [0, 1] scale

    figure = plot_attention_maps(maps)
    images = [ax.images[0] for ax in figure.axes if ax.images]  # row by row; then colour bars
    bars = [ax for ax in figure.axes if ax.get_ylabel()]
    low, high = images[0].get_clim()
    values = signed["attention"][0]
    assert low <= values.min() and values.max() <= high and low == -high
    assert "centred on 0" in bars[0].get_ylabel()
    assert images[-1].get_clim() == (0, 1) and bars[1].get_ylabel() == "weight"


def test_a_model_without_attention_maps_is_named():
    with (
        pytest.raises(ValueError, match="Linear has no module with attention_maps"),
        recording_attention(torch.nn.Linear(2, 2)),
    ):
        pass


DUAL = {
    "label": "dual",
    "name": "dual",
    "kwargs": {"n_heads_sa": 1, "n_heads_ra": 1, "symbol_retrieval": "positional_symbols",
               "symbol_retrieval_kwargs": {"max_length": 2}},
}  # fmt: skip
LINEAR = {"label": "lin", "name": "linear", "kwargs": {"n_heads": 2}}


def checkpointed_grid(tmp_path, mechanisms=(DUAL,), checkpoints=True):
    return load_grid(
        tiny_grid(
            tmp_path,
            name="ck",
            seeds=[3],
            tasks=[small(SAME_PAIR, n_train=64, n_evaluate=16)],
            mechanisms=mechanisms,
            training={"steps": 5, "eval_every": 5, "batch_size": 8},
            checkpoints=checkpoints,
        )
    )


def no_model_runs():
    """Within the block, running any torch module is an AssertionError."""

    def refuse(module, args):
        raise AssertionError(f"{type(module).__name__} ran while drawing recorded maps")

    return register_module_forward_pre_hook(refuse)  # a handle: removed when the block ends


def test_checkpointed_cells_keep_their_maps_and_reports_draw_them_without_a_model(tmp_path):
    spec = checkpointed_grid(tmp_path)
    run_grid(spec, workers=1, out=io.StringIO())
    store = ResultsStore(spec.store)
    (row,) = store.rows()
    assert store.checkpoint_path(row["key"]).is_file()
    assert store.maps_path(row["key"]) == tmp_path / "ck.maps" / f"{row['key']}.pt"
    model, task = load_cell_model(store, row)  # the weights are still kept
    test = task.splits(3)["test"]
    with torch.no_grad():
        logits, _ = model.eval()(test.inputs, test.targets)
    accuracy = (logits.argmax(-1) == test.targets).float().mean().item()
    assert accuracy == pytest.approx(row["metrics"]["test_acc"])

    # the maps the worker recorded are the trained model's on test example 0 of seed 3
    recorded = load_cell_maps(store, row)
    expected = attention_record(model, task, test)
    assert recorded["example"] == MAPS_EXAMPLE == 0
    assert recorded["labels"] == [str(int(t)) for t in test.inputs[0]] == expected["labels"]
    assert recorded["target"] == test.targets[0].tolist()
    assert set(recorded["maps"]) == {
        "blocks.0.attn.self_attention", "blocks.0.attn.relational_attention"
    }  # fmt: skip
    for name, kinds in expected["maps"].items():
        for kind, tensor in kinds.items():
            torch.testing.assert_close(recorded["maps"][name][kind], tensor)

    with no_model_runs():
        assert len(cell_attention_figure(store, row).axes) >= 3
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
    with no_model_runs():  # the maps do not need the checkpoint
        assert len(cell_attention_figure(store, row).axes) >= 3


def maps_notes(store: ResultsStore, folder) -> list[str]:
    blocks = attention_blocks(store, folder)
    return next((items for kind, *items in blocks if kind == "ul"), [[]])[0]


def test_missing_corrupt_and_absent_maps_are_notes(tmp_path):
    spec = checkpointed_grid(tmp_path, mechanisms=[DUAL, LINEAR, with_heads(LINEAR, "lin4", 4)])
    run_grid(spec, workers=1, out=io.StringIO())
    store = ResultsStore(spec.store)
    rows = {row["config"]["mechanism"]: row for row in store.rows()}
    assert all(row["status"] == "done" for row in rows.values())
    assert load_cell_maps(store, rows["lin"])["maps"] == {}  # linear attention has none
    with pytest.raises(ValueError, match="no attention maps: mechanism 'linear'"):
        cell_attention_figure(store, rows["lin"])
    store.maps_path(rows["lin4"]["key"]).unlink()  # kept a checkpoint, lost its maps
    folder = tmp_path / "figures"
    folder.mkdir()
    notes = sorted(maps_notes(store, folder))
    assert [note.split(": ", 1)[1] for note in notes] == [
        "no attention map, linear attention has no weights",
        "no attention map, its maps file is missing",
    ]
    assert notes[0].startswith(f"same_pair / xs / lin / seed 3 (cell {rows['lin']['key'][:12]})")
    assert [p.name for p in folder.iterdir()] == [
        label_file_name("attention", ("same_pair", "xs", "dual"))
    ]

    path = store.maps_path(rows["dual"]["key"])
    path.write_bytes(path.read_bytes()[:100])  # truncated
    (dual,) = [note for note in maps_notes(store, folder) if "/ dual /" in note]
    assert "no attention map, its maps file cannot be loaded (" in dual
    with pytest.raises(MapsError, match="cannot be loaded"):
        load_cell_maps(store, rows["dual"])
    torch.save({"maps": "not maps"}, path)
    with pytest.raises(MapsError, match="not a maps record"):
        load_cell_maps(store, rows["dual"])


def test_a_grid_without_checkpoints_keeps_no_maps_and_reports_none(tmp_path):
    spec = checkpointed_grid(tmp_path, checkpoints=None)
    run_grid(spec, workers=1, out=io.StringIO())
    store = ResultsStore(spec.store)
    (row,) = store.rows()
    assert not store.maps_path(row["key"]).parent.exists()
    assert not store.checkpoint_path(row["key"]).parent.exists()
    assert attention_blocks(store, tmp_path) == []


def test_a_cell_whose_maps_cannot_be_recorded_is_kept_and_its_report_says_why(
    tmp_path, monkeypatch
):
    def broken(model, task, test):
        raise RuntimeError("no maps today")

    monkeypatch.setattr(ablations.run.train, "attention_record", broken)
    spec = checkpointed_grid(tmp_path)
    out = io.StringIO()
    assert run_grid(spec, workers=1, out=out)["done"] == 1  # the trained cell is not lost
    note = "note: same_pair/xs/dual/seed3: attention maps not recorded: RuntimeError: no maps today"
    assert note in out.getvalue()
    store = ResultsStore(spec.store)
    (row,) = store.rows()
    assert store.checkpoint_path(row["key"]).is_file()
    with pytest.raises(MapsError, match="recording them failed when it finished: RuntimeError"):
        cell_attention_figure(store, row)
    (note,) = maps_notes(store, tmp_path)
    assert note.endswith(
        "no attention map, recording it failed when the cell finished (RuntimeError: no maps today)"
    )


def test_a_report_rebuilt_from_its_cells_csv_keeps_its_attention_maps(tmp_path):
    """Found rebuilding the committed reports (`make reports-from-cells`): a report rebuilt from
    its own cells.csv replaced its folder without the attention maps (a cells.csv cannot draw
    them), so the demo reports lost their figures. They are carried over, again and again, and
    a map whose file went missing is named instead of shown."""
    spec = checkpointed_grid(tmp_path, mechanisms=[DUAL, STD])
    run_grid(spec, workers=1, out=io.StringIO())
    folder = write_report(ResultsStore(spec.store), tmp_path / "report")
    drawn = (folder / "report.md").read_text()
    images = sorted(p.name for p in folder.glob("attention_*.png"))
    assert len(images) == 2 and all(f"({name})" in drawn for name in images)
    originals = {name: (folder / name).read_bytes() for name in images}
    for _ in range(2):  # into its own folder, twice
        write_report(folder / "cells.csv", folder)
        text = (folder / "report.md").read_text()
        assert "## Attention maps" in text and "Carried over from the report" in text
        assert "attention maps carried over from the report beside it" in text
        assert {name: (folder / name).read_bytes() for name in images} == originals
        assert all(f"({name})" in text for name in images)
    (folder / images[0]).unlink()
    again = write_report(folder / "cells.csv", tmp_path / "elsewhere")
    text = (again / "report.md").read_text()
    assert f"({images[1]})" in text and f"({images[0]})" not in text
    assert f"their files missing beside the cells.csv: {images[0]}" in text
    assert not (again / images[0]).exists() and (again / images[1]).is_file()
    (folder / images[1]).unlink()  # every map file gone: the header does not say carried over
    bare = write_report(folder / "cells.csv", tmp_path / "bare")
    text = (bare / "report.md").read_text()
    assert "carried over from the report beside it" not in text and "are not redrawn" in text
    assert "Nothing carried over from the report" in text and not list(bare.glob("attention_*"))
    assert f"their files missing beside the cells.csv: {', '.join(images)}" in text
    again = write_report(bare / "cells.csv", tmp_path / "bare_again")  # still named
    assert (
        f"their files missing beside the cells.csv: {', '.join(images)}"
        in (again / "report.md").read_text()
    )
    (folder / "attention.json").write_text('{"not": "blocks"}')
    with pytest.raises(ValueError, match="is not a report's attention.json"):
        write_report(folder / "cells.csv", tmp_path / "third")
    (folder / "attention.json").unlink()
    plain = write_report(folder / "cells.csv", tmp_path / "fourth")
    text = (plain / "report.md").read_text()
    assert "## Attention maps" not in text and "are not redrawn" in text


@pytest.mark.parametrize(
    "blocks",
    [{}, [], [["p", "x"]], [["h2", 3]], [["h2", "A", "x"]], [["h2", "A"], ["h2", "B"]],
     [["h2", "A"], ["img", 5, "alt"]], [["h2", "A"], ["img", ["x"], "alt"]],
     [["h2", "A"], ["img", "attention_a.png"]], [["h2", "A"], ["p", "t", "u"]],
     [["h2", "A"], ["img", "", "alt"]], [["h2", "A"], ["ul", "abc"]],
     [["h2", "A"], ["img", "notes.txt", "alt"]], [["h2", "A"], ["img", "report.md", "alt"]],
     [["h2", "A"], ["img", "../attention_a.png", "alt"]], [["h2", "A"], ["x", "y"]]],
)  # fmt: skip
def test_a_hostile_attention_json_is_refused_naming_it(tmp_path, blocks):
    """A review's finding: blocks of the wrong shape crashed the rebuilt report with tracebacks
    that named no file, and an image block could carry any file beside the cells.csv (a .txt
    embedded as a PNG). Only the blocks a report writes, with attention_*.png files, are read."""
    (tmp_path / "notes.txt").write_text("secret")
    path = tmp_path / "attention.json"
    path.write_text(json.dumps(blocks))
    with pytest.raises(ValueError, match=r"attention\.json"):
        read_attention(path)


def test_an_attention_json_that_is_a_link_or_no_json_is_refused(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps([["h2", "A"]]))
    assert read_attention(outside) == ([["h2", "A"]], {})
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "attention.json").symlink_to(outside)
    with pytest.raises(ValueError, match="is a link"):
        read_attention(tmp_path / "r" / "attention.json")
    outside.write_text("not json")
    with pytest.raises(ValueError, match="is not a report's attention.json"):
        read_attention(outside)


@pytest.mark.parametrize(
    "path", sorted(Path(__file__).parent.parent.glob("reports/*/attention.json")), ids=str
)
def test_every_committed_attention_json_is_read_with_all_its_maps(path):
    """A committed report with attention maps must survive `make reports-from-cells`: its
    attention.json reads strictly and every map it names lies beside it."""
    blocks, files = read_attention(path)
    named = [block[1] for block in blocks if block[0] == "img"]
    assert named and sorted(files) == sorted(named)
