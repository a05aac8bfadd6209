"""Score and mask mods (attn_zoo/kernels/softmax/mods.py): the naive path applies each as its
math says; every backend that serves a mod (naive, chunked natively, sdpa a mask mod as a
mask) agrees with the float64 naive path, gradients included, around the chunked block, with
GQA, both causal alignments, a caller's mask and 1 or 2 threads; chunked with a sliding window
skips the key tiles outside it and never allocates N x M; a score mod is refused where it
cannot run; mods reach mechanisms, grids and cached generation."""

import pytest
import torch
from allocations import largest_allocation
from grids import STD, tiny_grid

import attn_zoo as az
from attn_zoo.kernels.dispatch import UnsupportedCallError
from attn_zoo.kernels.softmax import build_mod, softmax_attention
from attn_zoo.kernels.softmax.chunked import BLOCK, Tiles
from attn_zoo.kernels.softmax.naive import naive
from attn_zoo.kernels.softmax.sdpa import BLOCK as SDPA_BLOCK
from attn_zoo.mechanisms.cache import LayerCache
from attn_zoo.models import LanguageModel
from attn_zoo.testing import torch_threads
from attn_zoo.testing.agreement import disagreements

MODS = {
    "window": {"mask_mod": {"name": "sliding_window", "window": 37}},
    "window_both_sides": {"mask_mod": {"name": "sliding_window", "window": 5, "causal": False}},
    "prefix_lm": {"mask_mod": {"name": "prefix_lm", "prefix": 7}},
    "softcap": {"score_mod": {"name": "softcap", "cap": 0.8}},
    "alibi": {"score_mod": {"name": "alibi", "n_heads": 4}},
    "softcap_in_window": {"score_mod": {"name": "softcap", "cap": 2.0},
                          "mask_mod": {"name": "sliding_window", "window": 64}},
}  # fmt: skip


def inputs(n, m, dtype=torch.float64, seed=0, heads=4, kv_heads=2):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((2, heads, n, 8), (2, kv_heads, m, 8), (2, kv_heads, m, 6))
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes]


def outputs_and_grads(backend, q, k, v, cotangent, **call):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = softmax_attention(q, k, v, backend=backend, **call)
    grads = torch.autograd.grad(out, (q, k, v), cotangent.to(out.dtype))
    return {"output": out, "grad q": grads[0], "grad k": grads[1], "grad v": grads[2]}


def test_the_naive_path_applies_each_mod_as_its_math_says():
    q, k, v = inputs(11, 11)
    i, j = torch.arange(11)[:, None], torch.arange(11)[None, :]
    scores = torch.einsum("bhnd,bhmd->bhnm", q, k.repeat_interleave(2, 1)) * 8**-0.5
    cases = {
        "window": ({"attn_mask": (j <= i) & (i - j < 3)}, {"mask_mod": ("sliding_window", 3)}),
        "prefix": ({"attn_mask": (j < 4) | (j <= i)}, {"mask_mod": ("prefix_lm", 4)}),
        "alibi": ({"attn_mask": -(2.0 ** (-8 * torch.arange(1, 5) / 4)).view(4, 1, 1) * (i - j)},
                  {"score_mod": ("alibi", 4)}),
    }  # fmt: skip
    for name, (explicit, mods) in cases.items():
        built = {key: _named(*spec) for key, spec in mods.items()}
        torch.testing.assert_close(naive(q, k, v, **built), naive(q, k, v, **explicit), msg=name)
    capped = 0.5 * torch.tanh(scores / 0.5)
    want = torch.softmax(capped, -1) @ v.repeat_interleave(2, 1)
    torch.testing.assert_close(naive(q, k, v, score_mod=_named("softcap", 0.5)), want)


def _named(name: str, value):
    argument = {"sliding_window": "window", "prefix_lm": "prefix", "alibi": "n_heads",
                "softcap": "cap"}[name]  # fmt: skip
    return build_mod({"name": name, argument: value})


@pytest.mark.parametrize("mod", list(MODS))
@pytest.mark.parametrize(
    "n, m, is_causal, with_mask",
    [(1, 1, False, False), (BLOCK - 1, BLOCK - 1, True, False), (BLOCK + 1, BLOCK + 1, False, True),
     (37, 2 * BLOCK + 1, "bottom_right", False), (2 * BLOCK + 1, 2 * BLOCK + 1, True, True)],
)  # fmt: skip
def test_every_backend_serving_a_mod_agrees_with_float64_naive(mod, n, m, is_causal, with_mask):
    """Each backend on 1 and 2 threads against one float64 naive reference (the costly part:
    computed once for both thread counts)."""
    q, k, v = inputs(n, m, torch.float32, seed=n + m)
    gen = torch.Generator().manual_seed(7)
    mask = torch.rand(2, 1, n, m, generator=gen) < 0.8 if with_mask else None
    call = {"attn_mask": mask, "is_causal": is_causal}
    call.update({key: build_mod(spec) for key, spec in MODS[mod].items()})
    cotangent = torch.randn(2, 4, n, 6, generator=gen, dtype=torch.float64)
    want = outputs_and_grads("naive", q.double(), k.double(), v.double(), cotangent, **call)
    served = ["naive", "chunked"] + ([] if "score_mod" in MODS[mod] else ["sdpa"])
    for threads in (1, 2):
        with torch_threads(threads):
            for backend in served:
                got = outputs_and_grads(backend, q, k, v, cotangent, **call)
                assert not disagreements(want, got, torch.float32), (backend, mod, threads)


def test_a_score_mod_is_refused_where_it_cannot_run_and_auto_picks_one_that_can():
    q, k, v = inputs(8, 8, torch.float32)
    cap = build_mod({"name": "softcap", "cap": 1.0})
    with pytest.raises(UnsupportedCallError, match="sdpa: does not support score_mod"):
        softmax_attention(q, k, v, score_mod=cap, backend="sdpa")
    torch.testing.assert_close(softmax_attention(q, k, v, score_mod=cap),
                               naive(q, k, v, score_mod=cap))  # fmt: skip


def test_chunked_with_a_sliding_window_skips_the_tiles_outside_it(monkeypatch):
    """N = 2048, window 64: a tile is computed only where the window reaches (about 2 key
    tiles per query tile, not 8), and no N x M tensor is ever allocated."""
    n, window = 8 * BLOCK, 64
    q, k, v = (t.requires_grad_(True) for t in inputs(n, n, torch.float32, heads=2, kv_heads=2))
    mod = build_mod({"name": "sliding_window", "window": window})
    computed = []
    scores = Tiles.scores
    monkeypatch.setattr(Tiles, "scores", lambda self, *a, **kw: computed.append(1) or scores(
        self, *a, **kw))  # fmt: skip

    def step():
        out = softmax_attention(q, k, v, mask_mod=mod, is_causal=True, backend="chunked")
        out.sum().backward()

    largest = largest_allocation(step)
    assert len(computed) == 2 * (8 + 7)  # forward and backward: 8 diagonal + 7 previous tiles
    assert largest < n * n // 4
    dense = largest_allocation(
        lambda: softmax_attention(q, k, v, mask_mod=mod, is_causal=True, backend="naive")
    )
    assert dense >= n * n  # the materialised path does allocate it: the probe can tell


def test_sdpa_with_a_sliding_window_calls_sdpa_per_query_tile_on_the_keys_it_reaches(
    monkeypatch,
):
    """N = 2048, window 64 as a mask mod on sdpa: one SDPA call per query tile, each on the
    two key tiles the window reaches (the first on one), never an N x M mask or score tensor
    (sdpa took the mod as a materialised (N, M) mask before: O(N^2) time and memory)."""
    n, window = 8 * SDPA_BLOCK, 64
    q, k, v = (t.requires_grad_(True) for t in inputs(n, n, torch.float32, heads=2, kv_heads=2))
    mod = build_mod({"name": "sliding_window", "window": window})
    keys = []
    fused = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional,
        "scaled_dot_product_attention",
        lambda q, k, *a, **kw: keys.append(k.shape[2]) or fused(q, k, *a, **kw),
    )

    def step():
        out = softmax_attention(q, k, v, mask_mod=mod, is_causal=True, backend="sdpa")
        out.sum().backward()

    assert largest_allocation(step) < n * n // 4
    assert keys == [SDPA_BLOCK] + [2 * SDPA_BLOCK] * 7


def test_mods_reach_mechanisms_grids_and_cached_generation(tmp_path):
    kwargs = {"n_heads": 2, "mask_mod": {"name": "sliding_window", "window": 4},
              "score_mod": {"name": "softcap", "cap": 5.0}}  # fmt: skip
    torch.manual_seed(0)
    model = LanguageModel(50, 32, 2, max_block_size=64, attention="standard",
                          attention_kwargs=kwargs).eval()  # fmt: skip
    prompt = torch.randint(0, 50, (1, 6))
    cached = model.generate(prompt, 10, temperature=0, use_cache=True)
    assert torch.equal(cached, model.generate(prompt, 10, temperature=0, use_cache=False))
    from ablations.grid.spec import load_grid
    from ablations.run.train import train_cell

    windowed = {**STD, "label": "std_window", "kwargs": {**STD["kwargs"], **kwargs}}
    path = tiny_grid(tmp_path, mechanisms=[windowed], seeds=[0], training={"steps": 4})
    (cell,) = load_grid(path).cells
    assert train_cell(cell).status == "done"


def test_bad_mods_are_named():
    with pytest.raises(ValueError, match="unknown attention mod: 'window'"):
        build_mod("window")
    with pytest.raises(ValueError, match="window=0: must be a positive int"):
        build_mod({"name": "sliding_window", "window": 0})
    for spec in (
        {"name": "sliding_window", "window": 10**30},
        {"name": "prefix_lm", "prefix": 2**63},
    ):
        with pytest.raises(ValueError, match=r"=\d+: must be a positive int <= 2\*\*63 - 1"):
            build_mod(spec)  # refused when built, not at the first call
    with pytest.raises(ValueError, match=r"their sum must be at most 2\*\*63 - 1"):
        build_mod({"name": "document", "lengths": [2**62, 2**62]})
    huge = build_mod({"name": "sliding_window", "window": 2**63 - 1})  # the largest: every key
    q, k, v = inputs(4, 4)
    torch.testing.assert_close(
        softmax_attention(q, k, v, mask_mod=huge), softmax_attention(q, k, v, is_causal=True)
    )
    with pytest.raises(ValueError, match="a mod is a name"):
        build_mod(3)
    with pytest.raises(ValueError, match="causal='false': must be true or false"):
        build_mod({"name": "sliding_window", "window": 2, "causal": "false"})
    with pytest.raises(ValueError, match="alibi n_heads=2 but this layer has n_heads=4"):
        az.build("standard", d_model=16, n_heads=4, score_mod={"name": "alibi", "n_heads": 2})
    layer = az.build("standard", d_model=16, n_heads=4, score_mod={"name": "alibi"})
    q = torch.zeros(1, 4, 1, 1)  # the layer's heads fill in ALiBi's: slopes 2^(-8 h / 4)
    slopes = -layer.score_mod(q, 0, torch.arange(4).view(1, 4, 1, 1), 1, 0).flatten()
    torch.testing.assert_close(slopes, 2.0 ** (-2.0 * torch.arange(1, 5)))
    q, k, v = inputs(4, 4)
    with pytest.raises(ValueError, match="mask_mod must be a function"):
        softmax_attention(q, k, v, mask_mod="sliding_window")


def test_alibi_built_for_other_heads_is_refused_and_an_in_place_score_mod_serves_chunked():
    """The hostile pass: alibi(4) on 8 heads extended its slopes silently (0.55 off alibi(8));
    a score mod adding to its score in place crashed chunked's backward ("a view of a leaf
    Variable that requires grad is being used in an in-place operation")."""
    q, k, v = inputs(6, 6)  # 4 heads
    with pytest.raises(ValueError, match=r"alibi\(n_heads=2\) called on 4 heads"):
        softmax_attention(
            q, k, v, is_causal=True, score_mod=build_mod({"name": "alibi", "n_heads": 2})
        )

    def in_place(score, b, h, q_idx, kv_idx):
        score += 0.1 * (q_idx - kv_idx)
        return score

    cotangent = torch.randn(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)
    want = outputs_and_grads("naive", q, k, v, cotangent, is_causal=True, score_mod=in_place)
    got = outputs_and_grads("chunked", q, k, v, cotangent, is_causal=True, score_mod=in_place)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("backend", ["naive", "chunked", "sdpa"])
def test_a_prefix_lm_mask_opens_the_prefix_of_a_causal_layer(backend):
    """A causal call intersected prefix_lm's mask with the causal one, so it did nothing (a
    causal language model's logits bitwise the plain causal model's). prefix_lm is a causal
    mask itself: it replaces a causal call's, and the prefix sees itself both ways, as the
    explicit mask (float64 naive, 1e-12) says."""
    torch.manual_seed(0)
    layer = az.build("standard", d_model=16, n_heads=2, backend=backend,
                     mask_mod={"name": "prefix_lm", "prefix": 4}).double()  # fmt: skip
    plain = az.build("standard", d_model=16, n_heads=2, backend="naive").double()
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    want = plain(x, attn_mask=(j < 4) | (j <= i))
    torch.testing.assert_close(layer(x, is_causal=True), want, atol=1e-12, rtol=1e-12)
    assert not torch.allclose(want, plain(x, is_causal=True))
    maps = layer.attention_maps(x, is_causal=True)["attention"]
    assert (maps[..., :4, :4] > 0).all() and (maps[..., 4:, :][..., j[0] > i[4:]] == 0).all()


def test_a_prefix_language_model_sees_its_prefix_both_ways_and_generates_without_a_cache():
    torch.manual_seed(0)
    kwargs = {"n_heads": 2, "mask_mod": {"name": "prefix_lm", "prefix": 4}}
    model = LanguageModel(50, 16, 2, max_block_size=32, attention_kwargs=kwargs).double()
    causal = LanguageModel(50, 16, 2, max_block_size=32, attention_kwargs={"n_heads": 2})
    causal = causal.double()
    causal.load_state_dict(model.state_dict())
    idx = torch.randint(0, 50, (2, 9))
    logits = model(idx)[0]
    assert not torch.allclose(logits, causal(idx)[0])
    in_prefix, after = idx.clone(), idx.clone()
    in_prefix[:, 3] = (idx[:, 3] + 1) % 50  # a later prefix token: position 0 sees it
    after[:, 6] = (idx[:, 6] + 1) % 50  # past the prefix: no earlier position sees it
    assert not torch.allclose(model(in_prefix)[0][:, 0], logits[:, 0])
    torch.testing.assert_close(model(after)[0][:, :6], logits[:, :6], atol=1e-12, rtol=1e-12)
    assert not model.supports_cache()  # a generated token inside the prefix changes the past
    prompt = idx[:, :2]
    assert torch.equal(model.generate(prompt, 6, temperature=0, use_cache=True),
                       model.generate(prompt, 6, temperature=0, use_cache=False))  # fmt: skip
    with pytest.raises(ValueError, match="no cached decoding"):
        model.blocks[0].attn(torch.randn(1, 2, 16).double(), cache=LayerCache(4))


@pytest.mark.parametrize("n", [0, 200])
def test_a_float_mask_keeps_its_zero_gradient_where_a_mod_empties_a_whole_query_tile(n):
    """Tenth hostile pass: a mask mod leaving sdpa's first query tile without a key (every
    query at N = 200) gave a float attn_mask that requires grad no gradient at all (None:
    autograd.grad raised), where naive and chunked give zeros."""
    q, k, v = inputs(n, 40, torch.float32)
    mask = torch.zeros(2, 4, n, 40, requires_grad=True)

    def no_key_before_256(b, h, q_idx, kv_idx):
        return (q_idx >= 256) & (kv_idx >= 0)

    for backend in ("naive", "chunked", "sdpa"):
        out = softmax_attention(q, k, v, attn_mask=mask, mask_mod=no_key_before_256,
                                backend=backend)  # fmt: skip
        (grad,) = torch.autograd.grad(out.sum(), mask)
        assert torch.equal(grad, torch.zeros_like(mask)), backend
