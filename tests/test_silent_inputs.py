"""Inputs that used to give a silent wrong answer or a confusing error are refused by name or
read as they are now: a score mod returning a narrower dtype than its score, a block's
mechanism kwargs naming what the block fills in itself, and a relations-game file reached
through a link repointed to another file of the same size and time."""

import os

import pytest
import torch
from test_relations_game_files import write_boards

from ablations.tasks.relations_game_files import load_boards
from attn_zoo.kernels.dispatch import family
from attn_zoo.models.block import Block, BlockConfig


def test_a_score_mod_narrowing_the_float64_score_is_refused_naming_both_dtypes():
    """The hostile pass: a mod returning float32 from the float64 reference's score was
    accepted, so the reference silently computed in float32."""
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(3))

    def narrowing(score, b, h, q_idx, kv_idx):
        return score.float() * 2

    def widening(score, b, h, q_idx, kv_idx):  # computes wider, cast back to the score's
        return score.double() * 2

    with pytest.raises(ValueError, match=r"score_mod narrowing returned a torch.float32 tensor "
                       r"from a torch.float64 score .*return torch.float64"):  # fmt: skip
        family("softmax")("naive", q=q, k=k, v=v, score_mod=narrowing)
    twice = family("softmax")("naive", q=q, k=k, v=v, scale=1.0, score_mod=widening)
    assert twice.dtype == torch.float64
    torch.testing.assert_close(twice, family("softmax")("naive", q=q, k=k, v=v, scale=2.0))
    q32, k32, v32 = q.float(), k.float(), v.float()
    out = family("softmax")("naive", q=q32, k=k32, v=v32, score_mod=widening)
    assert out.dtype == torch.float32


@pytest.mark.parametrize("key", ["backend", "d_model"])
@pytest.mark.parametrize("where", ["attention_kwargs", "cross_attention"])
def test_a_block_setting_in_the_mechanisms_kwargs_is_named_with_the_field_to_use(where, key):
    """The hostile pass: attention_kwargs={"backend": "naive"} was a TypeError about a
    duplicate keyword argument, naming neither the setting nor the field."""
    given = {"n_heads": 2, key: "naive" if key == "backend" else 8}
    message = rf"{where}\['{key}'\]=.*set the block's own field {key}= \(BlockConfig.{key}\)"
    with pytest.raises(ValueError, match=message):
        BlockConfig(d_model=8, **{where: given})
    with pytest.raises(ValueError, match=message):
        Block(d_model=8, **{where: given})
    block = Block(d_model=8, backend="naive", attention_kwargs={"n_heads": 2})
    assert block.attn.backend == "naive"


def test_a_link_repointed_to_a_file_of_the_same_size_and_time_is_read_anew(tmp_path):
    """The hostile pass: the boards were cached by (path, size, mtime), so a link repointed to
    another file of equal size and mtime served the old boards."""
    first, second, link = tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "boards.npz"
    write_boards(first, 6)
    write_boards(second, 6, seed=1)
    made = os.stat(first)
    os.utime(second, ns=(made.st_atime_ns, made.st_mtime_ns))
    assert os.stat(second).st_size == made.st_size  # what the old key could not tell apart
    link.symlink_to(first)
    images, _ = load_boards(link, -1)
    link.unlink()
    link.symlink_to(second)
    assert torch.equal(load_boards(link, -1)[0], load_boards(second, -1)[0])
    assert not torch.equal(load_boards(link, -1)[0], images)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", ["naive", "chunked", "sdpa", "auto"])
def test_half_inputs_with_a_float32_mask_at_its_minimum_match_the_float64_reference(dtype, backend):
    """The eleventh hostile pass: sdpa cast a float32 mask to float16 after finding its empty
    rows, so a row of finfo(float32).min (transformers' masked value) became one of -inf and
    gave zeros, the reference the uniform average of its keys (error 0.76 in float16)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=g).to(dtype) for _ in range(3))
    mask = torch.zeros(2, 1, 5, 5)
    low = torch.finfo(torch.float32).min
    mask[..., 3:] = low  # keys 3, 4 masked for every query
    mask[0, :, 0, :] = low  # query 0 of the first batch row: every key at the minimum
    mask[1, :, 2, :] = low
    reference = family("softmax")("naive", q=q.double(), k=k.double(), v=v.double(),
                                  attn_mask=mask.double())  # fmt: skip
    out = family("softmax")(backend, q=q, k=k, v=v, attn_mask=mask)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), reference, atol=2e-2, rtol=2e-2)
