"""What a score or mask mod returns (attn_zoo/kernels/softmax/mods.py): a float tensor of the
score's shape, a boolean tensor (B or 1, H or 1, N or 1, M); anything else is refused by the
mod's name, what it returned and what is valid, with the same message on every backend that
takes the mod (naive, chunked; sdpa a mask mod as a mask), never reinterpreted. What is valid
agrees with the float64 reference (masked softmax written out here): atol 1e-5, rtol 1e-4 in
float32, 1e-12 in float64."""

import pytest
import torch

from attn_zoo.kernels.softmax import softmax_attention
from attn_zoo.kernels.softmax.chunked import BLOCK

MASK_BACKENDS = ["naive", "chunked", "sdpa"]  # sdpa: the mask mod materialised
SCORE_BACKENDS = ["naive", "chunked"]


def qkv(n, m=None, dtype=torch.float64, batch=2, heads=2):
    gen = torch.Generator().manual_seed(n)
    shapes = [(batch, heads, length, 8) for length in (n, m or n, m or n)]
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes]


def reference(q, k, v, allowed):
    """softmax(q k^T / sqrt(d)) v over the allowed keys, float64."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v


def float_causal(b, h, q_idx, kv_idx):  # attn_mask's additive convention, not a mask mod's
    return torch.where(kv_idx <= q_idx, 0.0, float("-inf"))


def bool_causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


@pytest.mark.parametrize("backend", MASK_BACKENDS)
def test_an_additive_float_mask_mod_is_refused_not_cast_to_bool(backend):
    """Cast to bool, 0 (attend) became False and -inf True: causal turned anti-causal (every
    backend, off the causal reference by 2.1 here). Refused by name now; the boolean mod
    agrees with the reference."""
    q, k, v = qkv(6)
    with pytest.raises(ValueError, match=r"^mask_mod float_causal returned a torch.float32 "
                       r"tensor: a mask mod returns a boolean tensor.*0 / -inf"):  # fmt: skip
        softmax_attention(q, k, v, mask_mod=float_causal, backend=backend)
    causal = torch.arange(6)[None, :] <= torch.arange(6)[:, None]
    got = softmax_attention(q, k, v, mask_mod=bool_causal, backend=backend)
    torch.testing.assert_close(got, reference(q, k, v, causal), atol=1e-12, rtol=1e-12)


def query_only(b, h, q_idx, kv_idx):  # (B, H, N, 1): the same answer for every key
    return (b + h + q_idx) >= 0


def key_reduced(score, b, h, q_idx, kv_idx):  # (B, H, N, 1): one score for every key
    return score.amax(dim=-1, keepdim=True)


@pytest.mark.parametrize("n", [5, BLOCK + 3])
@pytest.mark.parametrize("backend", MASK_BACKENDS)
def test_a_mask_mod_of_the_wrong_shape_is_refused(backend, n):
    q, k, v = qkv(n, dtype=torch.float32)
    message = r"^mask_mod query_only returned shape \(2, 2, \d+, 1\) \(B, H, N, M here: .*\)"
    with pytest.raises(ValueError, match=message):
        softmax_attention(q, k, v, mask_mod=query_only, backend=backend)


@pytest.mark.parametrize("n", [5, BLOCK + 3])
@pytest.mark.parametrize("backend", SCORE_BACKENDS)
def test_a_score_mod_of_the_wrong_shape_is_refused(backend, n):
    q, k, v = qkv(n, dtype=torch.float32)
    message = (
        r"^score_mod key_reduced returned shape \(2, 2, \d+, 1\) \(B, H, N, M here: "
        r"\(2, 2, \d+, \d+\)\): a score mod returns a float tensor of its score's shape"
    )
    with pytest.raises(ValueError, match=message):
        softmax_attention(q, k, v, score_mod=key_reduced, backend=backend)


@pytest.mark.parametrize("backend", MASK_BACKENDS)
def test_a_mask_shared_by_batch_heads_or_queries_is_valid(backend):
    """1 in place of B, H or N is the same mask for each: a key-padding mask (B, 1, 1, M)."""
    q, k, v = (t.float() for t in qkv(BLOCK + 3))
    lengths = torch.tensor([BLOCK + 3, 7])

    def key_padding(b, h, q_idx, kv_idx):
        return kv_idx < lengths[b]

    allowed = (torch.arange(BLOCK + 3) < lengths.view(2, 1, 1, 1)).expand(2, 2, BLOCK + 3, -1)
    got = softmax_attention(q, k, v, mask_mod=key_padding, backend=backend)
    torch.testing.assert_close(got.double(), reference(q, k, v, allowed), atol=1e-5, rtol=1e-4)


def always(b, h, q_idx, kv_idx):
    return True


def one(score, b, h, q_idx, kv_idx):
    return 1.0


def zero_dim(score, b, h, q_idx, kv_idx):
    return torch.tensor(0.0)


@pytest.mark.parametrize(
    "mods, backends, message",
    [
        ({"mask_mod": always}, MASK_BACKENDS,
         r"mask_mod always returned bool True, not a tensor: a mask mod returns a boolean"),
        ({"score_mod": one}, SCORE_BACKENDS,
         r"score_mod one returned float 1.0, not a tensor: a score mod returns a float tensor"),
        ({"score_mod": zero_dim}, SCORE_BACKENDS,
         r"score_mod zero_dim returned shape \(\) \(B, H, N, M here"),
    ],
)  # fmt: skip
def test_python_values_and_scalars_are_refused_alike_on_every_backend(mods, backends, message):
    """A Python bool from a mask mod ran on naive and sdpa and was an AttributeError on
    chunked; a scalar from a score mod an AttributeError, IndexError or an overflow."""
    q, k, v = qkv(5, 9)
    said = set()
    for backend in backends:
        with pytest.raises(ValueError, match=f"^{message}") as err:
            softmax_attention(q, k, v, backend=backend, **mods)
        said.add(str(err.value))
    assert len(said) == 1, said  # the same message everywhere
