"""Score and mask mods must be pointwise (attn_zoo/kernels/softmax/mods.py, `check_pointwise`):
naive calls a mod on the whole (N, M), chunked per 256 x 256 tile, so a mod reducing over the
keys it is given (top-k) or reading the index tensors' shapes ("the last 32 keys") computed
other attention on chunked than on naive above one tile, and nothing said so. Now every
backend that would take such a mod refuses it, naming it; the library's mods pass, once per mod
and shape, and serve the same attention on chunked as on naive."""

import inspect
import types

import pytest
import torch

from attn_zoo.kernels.softmax import mods as mods_module
from attn_zoo.kernels.softmax import softmax_attention
from attn_zoo.kernels.softmax.mods import (
    KEY_ELEMENTS,
    MODS,
    and_masks,
    build_mod,
    check_pointwise,
    mod_key,
    not_mask,
    or_masks,
    shift_queries,
)
from attn_zoo.testing.problems import MASK_MODS, SCORE_MODS

N = 300  # more than one chunked tile (256): where the two backends parted
CONTRACT = r"elementwise, as FlexAttention requires"


def qkv(n=N, heads=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, n, 16, generator=gen, dtype=torch.float64) for _ in "qkv"]


def top8_score(score, b, h, q_idx, kv_idx):
    """Top-k sparse attention: only each query's 8 highest scores survive."""
    kth = score.topk(8, dim=-1).values[..., -1:]
    return torch.where(score >= kth, score, torch.finfo(score.dtype).min)


def last32_mask(b, h, q_idx, kv_idx):
    """Every query sees the last 32 keys: M read from the index tensor's shape."""
    return kv_idx >= kv_idx.shape[-1] - 32


def pairs_score(score, b, h, q_idx, kv_idx):
    """The scores as they are, through a view that needs an even number of keys."""
    return score.unflatten(-1, (-1, 2)).flatten(-2)


@pytest.mark.parametrize(
    ("kind", "mod", "backend"),
    [
        *(("score_mod", top8_score, b) for b in ("naive", "chunked", "flex", "auto")),
        *(("mask_mod", last32_mask, b) for b in ("naive", "chunked", "sdpa", "flex", "auto")),
    ],
)
def test_a_mod_that_is_not_pointwise_is_refused_on_every_backend_naming_it(kind, mod, backend):
    """Before: naive and chunked served both, 0.7 (top-k) and 1.4 (last 32 keys) apart; flex
    (which takes mods itself, on a GPU) failed inside FlexAttention with an IndexError."""
    q, k, v = qkv()
    name = mod.__name__
    with pytest.raises(
        ValueError, match=rf"{kind} {name} is not pointwise: .* values .*{CONTRACT}"
    ):
        softmax_attention(q, k, v, backend=backend, **{kind: mod})


def test_a_mod_failing_on_a_tile_of_another_shape_is_refused_with_its_error():
    """pairs_score runs on the whole (an even M) and fails on chunked's odd-width last tile."""
    q, k, v = qkv(n=64)
    message = (
        r"score_mod pairs_score is not pointwise: on the queries 63..63 and keys 63..63 .* it "
        rf"raised RuntimeError: .*{CONTRACT}"
    )
    with pytest.raises(ValueError, match=message):
        softmax_attention(q, k, v, backend="naive", score_mod=pairs_score)


def library_mods(heads: int) -> dict[str, object]:
    """Every mod the library ships (MODS, the testing kit's), the combinators' and shifted
    ones, by a name for the test ids."""
    args = {
        "causal": {},
        "sliding_window": {"window": 40},
        "prefix_lm": {"prefix": 70},
        "document": {"lengths": [90, 130, 20]},
        "alibi": {"n_heads": heads},
        "softcap": {"cap": 1.5},
    }
    assert set(args) == set(MODS.names())  # a new named mod is checked here too
    built = {name: build_mod({"name": name, **kw}) for name, kw in args.items()}
    problem = types.SimpleNamespace(heads=heads, seed=0)
    kit = {**SCORE_MODS, **MASK_MODS}
    return {
        **built,
        "symmetric_alibi": build_mod({"name": "alibi", "n_heads": heads, "symmetric": True}),
        "sliding_window_both_sides": build_mod(
            {"name": "sliding_window", "window": 50, "causal": False}
        ),
        **{f"kit_{name}": make(problem, "cpu") for name, make in kit.items()},
        "and_masks": and_masks(built["document"], built["causal"]),
        "or_masks": or_masks(built["sliding_window"], built["prefix_lm"]),
        "not_mask": not_mask(built["sliding_window"]),
        "shifted_window": shift_queries(built["sliding_window"], 7, score=False),
        "shifted_alibi": shift_queries(built["alibi"], 7, score=True),
    }


@pytest.mark.parametrize("name", sorted(library_mods(4)))
def test_every_library_mod_is_pointwise_and_chunked_serves_naives_attention(name):
    mod = library_mods(4)[name]
    kind = "score_mod" if len(inspect.signature(mod).parameters) == 5 else "mask_mod"
    check_pointwise(kind, mod, (2, 4, N, N), torch.float64 if kind == "score_mod" else None, "cpu")
    q, k, v = qkv(heads=4)
    is_causal = "alibi" in name and "symmetric" not in name  # one-sided ALiBi: causal only
    want = softmax_attention(q, k, v, backend="naive", is_causal=is_causal, **{kind: mod})
    got = softmax_attention(q, k, v, backend="chunked", is_causal=is_causal, **{kind: mod})
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def test_the_check_runs_once_per_mod_and_shape(monkeypatch):
    """Counted by the probe's tiles: a mod rebuilt for every call (as a mechanism's) has the
    same key; longer sequences use the same probe (from 513 queries and keys on); another
    mod or batch is probed again; a mod without a key at every call."""
    probes = []
    tiles = mods_module.probe_tiles
    monkeypatch.setattr(mods_module, "probe_tiles", lambda n, m: probes.append(1) or tiles(n, m))
    mods_module._POINTWISE.clear()
    q, k, v = qkv(n=80)
    for backend in ("naive", "chunked", "naive", "sdpa"):
        window = build_mod({"name": "sliding_window", "window": 21})
        softmax_attention(q, k, v, backend=backend, mask_mod=window)
    assert len(probes) == 1
    long = qkv(n=600)
    softmax_attention(*long, backend="chunked", mask_mod=window)
    assert len(probes) == 2  # 80 and 600 queries and keys: probes of 80 x 80 and 513 x 513
    softmax_attention(*qkv(n=700), backend="chunked", mask_mod=window)
    assert len(probes) == 2  # 600 and 700 queries and keys: the same probe of 513 x 513
    prefix = build_mod({"name": "prefix_lm", "prefix": 3})
    softmax_attention(*long, backend="chunked", mask_mod=prefix)
    assert len(probes) == 3
    softmax_attention(*(t.expand(2, -1, -1, -1) for t in long), backend="chunked", mask_mod=window)
    assert len(probes) == 4
    table = torch.randn(KEY_ELEMENTS + 1)  # more than mod_key keys by content: no key

    def big_bias(score, b, h, q_idx, kv_idx):
        return score + table[(q_idx - kv_idx).abs()]

    for _ in range(3):
        softmax_attention(q, k, v, backend="chunked", score_mod=big_bias)
    assert len(probes) == 4 + 3  # once a call: the family's check (chunked has none of its own)


def topk_score(k: int, fill: float):
    """Top-k sparse attention: each query's k highest scores kept, the others set to `fill`."""

    def topk(score, b, h, q_idx, kv_idx):
        kth = score.topk(min(k, score.shape[-1]), dim=-1).values[..., -1:]
        return score.masked_fill(score < kth, fill)

    topk.__name__ = f"top{k}"
    return topk


def test_a_mod_masking_with_minus_infinity_is_compared_exactly_there():
    """Before: the tolerance 256 eps (1 + |want|) was infinite where the whole gave -inf, so a
    top-4 mod filling -inf passed (a tile keeping a score the whole masked counted as equal)
    while the same mod filling -1e9 was refused."""
    mods_module._POINTWISE.clear()
    with pytest.raises(ValueError, match=r"score_mod top4 is not pointwise: .* values differ"):
        check_pointwise(
            "score_mod", topk_score(4, float("-inf")), (1, 2, 64, 64), torch.float64, "cpu"
        )


def test_a_top_k_mod_keeping_more_keys_than_a_small_probe_is_refused():
    """Before: the probe had 64 keys, so a top-64 mod kept every key of every tile and passed
    (cached for every M); at 512 keys chunked (top 64 of each 256-key tile) was 0.25 off naive."""
    q, k, v = qkv(n=512)
    for backend in ("naive", "chunked"):
        with pytest.raises(ValueError, match=rf"score_mod top64 is not pointwise: .*{CONTRACT}"):
            softmax_attention(q, k, v, backend=backend, score_mod=topk_score(64, -1e9))


def test_a_mod_without_a_key_is_probed_again_when_what_it_reads_changes():
    """Before: a mod reading a plain object's attribute (no mod_key) was cached by its id, so
    a pass while it was pointwise stood after the attribute made it a top-4 mod."""

    class Config:
        topk = None

    config = Config()
    top4 = topk_score(4, -1e9)

    def maybe_top4(score, b, h, q_idx, kv_idx):
        return score if config.topk is None else top4(score, b, h, q_idx, kv_idx)

    check_pointwise("score_mod", maybe_top4, (1, 2, 64, 64), torch.float64, "cpu")
    config.topk = 4
    with pytest.raises(ValueError, match=r"score_mod maybe_top4 is not pointwise"):
        check_pointwise("score_mod", maybe_top4, (1, 2, 64, 64), torch.float64, "cpu")


@pytest.mark.parametrize("name", sorted(library_mods(4)))
def test_every_library_mod_has_a_key_so_its_check_is_cached(name):
    """A mod without a key is probed at every call: none of the library's may pay that."""
    assert mod_key(library_mods(4)[name], []) is not None


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_call_only_ever_compiled_is_checked_when_it_is_traced(dynamic):
    """Before: under torch.compile the check was skipped, so a top-k mod in a model that only
    ever ran compiled was served by chunked (other attention than naive). The probe now runs
    when Dynamo traces the call (at its caps where a size is traced as dynamic)."""
    mods_module._POINTWISE.clear()
    top4 = topk_score(4, -1e9)

    def attend(q, k, v):
        return softmax_attention(q, k, v, backend="chunked", score_mod=top4)

    compiled = torch.compile(attend, fullgraph=True, dynamic=dynamic)
    with pytest.raises(Exception, match=rf"score_mod top4 is not pointwise: .*{CONTRACT}"):
        compiled(*qkv(n=300))
    torch.compiler.reset()


def topk_by_shape(read: str, sizes: tuple[int, ...], topk: bool = True):
    """A score mod dividing by a captured temperature per batch entry (`read` "batch"), query
    ("query") or head ("head"), viewed by the call's sizes `sizes` (B, H, N): right on the
    whole (and on chunked's tiles of N <= 256 queries), raising on any other shape; then
    each query's top 32 keys kept (`topk`), else pointwise."""
    batch, heads, n = sizes
    view = {"batch": (batch, 1, 1, 1), "head": (1, heads, 1, 1), "query": (1, 1, n, 1)}[read]
    temperature = 0.5 + torch.rand(view, generator=torch.Generator().manual_seed(1)).flatten()

    def by_shape(score, b, h, q_idx, kv_idx):
        s = score / temperature.view(view)
        if not topk:
            return s
        kth = s.topk(32, dim=-1).values[..., -1:]
        return torch.where(s >= kth, s, torch.full_like(s, float("-inf")))

    by_shape.__name__ = f"{'top32' if topk else 'scaled'}_by_{read}"
    return by_shape


@pytest.mark.parametrize(("read", "batch", "n"), [("batch", 4, 8), ("query", 1, 100)])
def test_a_mod_raising_on_the_probes_shape_is_probed_on_the_calls_own(read, batch, n):
    """Before: the probe (min(B, 2) batch entries, at most 64 queries) made the whole call of
    these raise, took it as the real call raising too and checked nothing: chunked and auto
    served the top-32 mod 0.296 (per batch entry) and 0.388 (per query) off naive. The mod
    reading B without the top-k passes (probed on the call's B), and chunked serves naive's
    attention; reading N it is refused too (the kernels tile queries)."""
    gen = torch.Generator().manual_seed(0)
    sizes = (n, 600, 600)
    q, k, v = (torch.randn(batch, 2, s, 16, generator=gen, dtype=torch.float64) for s in sizes)
    for topk in (True, False):
        mod = topk_by_shape(read, (batch, 2, n), topk)
        if topk or read == "query":
            for backend in ("chunked", "auto"):
                with pytest.raises(ValueError, match=rf"score_mod {mod.__name__} is not pointwise"):
                    softmax_attention(q, k, v, backend=backend, score_mod=mod)
        else:
            want = softmax_attention(q, k, v, backend="naive", score_mod=mod)
            got = softmax_attention(q, k, v, backend="chunked", score_mod=mod)
            torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def compiled_chunked(mod):
    """softmax_attention on chunked with `mod`, compiled (fullgraph, Dynamo only)."""
    torch.compiler.reset()
    return torch.compile(
        lambda q, k, v: softmax_attention(q, k, v, backend="chunked", score_mod=mod),
        backend="eager",
        fullgraph=True,
    )


UNCHECKED = r"score_mod {} could not be checked pointwise when torch.compile traced the call"


def test_a_compiled_call_whose_probes_all_raise_is_refused_without_an_eager_check():
    """Before: traced, every probe (1 batch entry, 1 head) made a mod reading the head count by
    shape raise, nothing was checked, and the compiled chunked call served a top-32 mod 0.318
    off naive. Now a mod no probe could check when traced is refused, pointwise or not, unless
    it passed an eager check before."""
    mods_module._POINTWISE.clear()
    q, k, v = qkv(n=40, heads=4)
    for topk in (True, False):
        mod = topk_by_shape("head", (1, 4, 40), topk)
        with pytest.raises(Exception, match=UNCHECKED.format(mod.__name__)):
            compiled_chunked(mod)(q, k, v)
    torch.compiler.reset()


@pytest.mark.slow  # two traces of the chunked kernel: about 10 s on the 2-core CPU
def test_a_compiled_call_whose_probes_all_raise_is_served_after_an_eager_check():
    """The pointwise mod reading the head count by shape, checked by an eager call, is served
    compiled (naive's attention); the top-32 one is refused eagerly, and so still compiled."""
    mods_module._POINTWISE.clear()
    q, k, v = qkv(n=40, heads=4)
    scaled, top32 = (topk_by_shape("head", (1, 4, 40), topk) for topk in (False, True))
    want = softmax_attention(q, k, v, backend="naive", score_mod=scaled)  # checked eagerly
    torch.testing.assert_close(compiled_chunked(scaled)(q, k, v), want, atol=1e-12, rtol=1e-10)
    with pytest.raises(ValueError, match=r"score_mod top32_by_head is not pointwise"):
        softmax_attention(q, k, v, backend="chunked", score_mod=top32)
    with pytest.raises(Exception, match=UNCHECKED.format("top32_by_head")):
        compiled_chunked(top32)(q, k, v)
    torch.compiler.reset()


def top64_queries(score, b, h, q_idx, kv_idx):
    """Each key visible to its 64 highest-scoring queries only (a key-choice routing)."""
    kth = score.topk(min(64, score.shape[-2]), dim=-2).values[..., -1:, :]
    return torch.where(score >= kth, score, torch.full_like(score, -1e4))


def test_a_reduction_over_queries_is_seen_as_one_over_keys():
    """Before: the probe had at most 64 queries (cut every 21), chunked tiles them by 256: a
    top-64 over the queries kept every query of the probe and passed; at 512 queries chunked
    was 2.23 off naive."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, s, 16, generator=gen, dtype=torch.float64) for s in (512, 64, 64))
    for backend in ("naive", "chunked"):
        with pytest.raises(
            ValueError, match=rf"score_mod top64_queries is not pointwise: .*{CONTRACT}"
        ):
            softmax_attention(q, k, v, backend=backend, score_mod=top64_queries)


def near_max(score, b, h, q_idx, kv_idx):
    """The keys more than 8 below the row's largest score dropped (a sparsification)."""
    keep = score >= score.amax(dim=-1, keepdim=True) - 8.0
    return torch.where(keep, score, torch.full_like(score, float("-inf")))


def test_a_reduction_biting_only_on_wide_scores_is_refused():
    """Before: the probe's scores were standard normal, so a tile's largest score was never 8
    below its row's and near_max passed; on a long context with one strong match (4,096 keys)
    chunked and auto, keeping the weak keys of the tiles without it, were 0.806 off naive."""
    gen = torch.Generator().manual_seed(1)
    q = torch.ones(1, 1, 4, 1, dtype=torch.float64)
    k = 1 + 0.1 * torch.randn(1, 1, 4096, 1, generator=gen, dtype=torch.float64)
    k[..., 0, :] = 10
    v = torch.randn(1, 1, 4096, 4, generator=gen, dtype=torch.float64)
    for backend in ("chunked", "auto"):
        with pytest.raises(ValueError, match=rf"score_mod near_max is not pointwise: .*{CONTRACT}"):
            softmax_attention(q, k, v, backend=backend, score_mod=near_max)


def test_a_mod_raising_on_the_calls_whole_shape_is_refused_on_chunked_too():
    """Before: a mod raising on the whole call (here: a table of one key tile's length added by
    the shape it is given) was not checked, and chunked, calling it per 256-key tile, served it
    while naive raised. Now every backend raises the whole call's error."""
    table = torch.zeros(256)

    def tile_bias(score, b, h, q_idx, kv_idx):
        return score + table[: kv_idx.shape[-1]]

    q, k, v = qkv(n=512)
    for backend in ("naive", "chunked", "auto"):
        with pytest.raises(RuntimeError, match="size of tensor"):
            softmax_attention(q, k, v, backend=backend, score_mod=tile_bias)
