"""Our softmax backends as transformers attention implementations (attn_zoo_<backend>): a tiny
random Llama gives transformers' own eager / sdpa logits and greedy tokens, padded, cached and
uncached.

flex does not serve CPU calls (FlexAttention's CPU path is wrong at some shapes, e.g. NaN
logits at 40 tokens): on CPU its implementation is checked to refuse with the reason."""

import copy
import re
import subprocess
import sys
import textwrap

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AttentionInterface,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402

import attn_zoo.interop.transformers as zt  # noqa: E402
from attn_zoo.kernels import UnsupportedCallError  # noqa: E402
from attn_zoo.kernels.dispatch import family  # noqa: E402
from attn_zoo.kernels.softmax import softmax_attention  # noqa: E402
from attn_zoo.kernels.softmax.masks import causal_mask  # noqa: E402

ATOL = 1e-5
FORWARD_BACKENDS = ["naive", "chunked", "sdpa"]  # the CPU backends (flex: refused on CPU)
GENERATE_BACKENDS = FORWARD_BACKENDS
VOCAB, LENGTH, PAD = 64, 10, 3

CONFIG = LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query heads: 2 query heads per kv head
    max_position_embeddings=64,
    initializer_range=0.2,  # peaked attention, logits of a few units: alignment errors show
    pad_token_id=0,
)


def build(implementation: str) -> LlamaForCausalLM:
    """The same random model (seed 0) on `implementation`; its own copy of the config (the
    implementation is stored in the config, a shared one would switch every model)."""
    torch.manual_seed(0)
    config = copy.deepcopy(CONFIG)
    return LlamaForCausalLM._from_config(
        config, attn_implementation=implementation, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module", autouse=True)
def registered():
    return zt.register()


@pytest.fixture(scope="module")
def hf():
    return {name: build(name) for name in ("eager", "sdpa")}


@pytest.fixture(scope="module")
def ids():
    generator = torch.Generator().manual_seed(1)
    return torch.randint(1, VOCAB, (2, LENGTH), generator=generator)


@pytest.fixture(scope="module")
def left_padded():
    """Sequence 1 is left-padded by PAD tokens."""
    mask = torch.ones(2, LENGTH, dtype=torch.long)
    mask[1, :PAD] = 0
    return mask


@pytest.fixture
def calls(monkeypatch):
    """The kernel calls the integration makes: (backend, N, M, mask given, is_causal)."""
    seen = []

    def spy(q, k, v, attn_mask=None, is_causal=False, backend="auto", **kwargs):
        seen.append((backend, q.shape[2], k.shape[2], attn_mask is not None, is_causal))
        return softmax_attention(q, k, v, attn_mask, is_causal, backend=backend, **kwargs)

    monkeypatch.setattr(zt, "softmax_attention", spy)
    return seen


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# --- (1) equal-length batch, (2) left padding ------------------------------------------------


@pytest.mark.parametrize("backend", FORWARD_BACKENDS)
def test_equal_length_logits_match_eager_and_sdpa(backend, hf, ids, calls):
    model = build(f"attn_zoo_{backend}")
    with torch.no_grad():
        ours = model(ids).logits
        refs = {name: ref(ids).logits for name, ref in hf.items()}
    # every layer ran our kernel, maskless and top-left causal (equal lengths)
    assert calls == [(backend, LENGTH, LENGTH, False, True)] * CONFIG.num_hidden_layers
    for name, ref in refs.items():
        torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0, msg=f"vs {name}")


@pytest.mark.parametrize("backend", FORWARD_BACKENDS)
def test_left_padded_logits_match_at_real_tokens(backend, hf, ids, left_padded, calls):
    model = build(f"attn_zoo_{backend}")
    with torch.no_grad():
        ours = model(ids, attention_mask=left_padded).logits
        refs = {name: ref(ids, attention_mask=left_padded).logits for name, ref in hf.items()}
    assert calls and all(given for *_, given, _ in calls)  # the padding reached the kernel
    assert ours.isfinite().all()  # fully masked (padding) query rows stay finite
    real = left_padded.bool()
    for name, ref in refs.items():
        torch.testing.assert_close(ours[real], ref[real], atol=ATOL, rtol=0, msg=f"vs {name}")
    # the padding matters: the padded sequence's logits differ from its unpadded run
    with torch.no_grad():
        unpadded = model(ids).logits
    assert max_diff(ours[1, PAD:], unpadded[1, PAD:]) > 1e-2


# --- (3) cached decoding ----------------------------------------------------------------------


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("padded", [False, True], ids=["equal_length", "left_padded"])
@pytest.mark.parametrize("backend", GENERATE_BACKENDS)
def test_greedy_generation_matches_hf_sdpa(backend, padded, cache, hf, ids, left_padded, calls):
    """Same tokens and same per-step logits as transformers' sdpa, KV cache dynamic (decode
    steps: one query, no mask, bottom-right) or static (prefill: more keys than queries, the
    unwritten slots at the end, which our mask function masks explicitly)."""
    kwargs = dict(
        max_new_tokens=8,
        do_sample=False,
        cache_implementation=None if cache == "dynamic" else "static",
        return_dict_in_generate=True,
        output_logits=True,
    )
    if padded:
        kwargs["attention_mask"] = left_padded
    ours = build(f"attn_zoo_{backend}").generate(ids, **kwargs)
    ref = hf["sdpa"].generate(ids, **kwargs)
    assert ours.sequences.shape == (2, LENGTH + 8)
    assert torch.equal(ours.sequences, ref.sequences)
    for step, (a, b) in enumerate(zip(ours.logits, ref.logits, strict=True)):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=f"step {step}")
    assert len(calls) == 8 * CONFIG.num_hidden_layers  # prefill + 7 decode steps, every layer
    if cache == "dynamic" and not padded:
        assert calls[-1] == (backend, 1, LENGTH + 7, False, "bottom_right")


def cached_and_uncached(model, ids, new: int):
    """Logits of the last `new` positions: after a cached prefill of the others, and from one
    uncached forward over all."""
    with torch.no_grad():
        prefill = model(ids[:, :-new], use_cache=True)
        cached = model(ids[:, -new:], past_key_values=prefill.past_key_values).logits
        full = model(ids).logits[:, -new:]
    return cached, full


@pytest.mark.parametrize("new", [1, 3], ids=["one_query", "three_queries"])
@pytest.mark.parametrize("backend", GENERATE_BACKENDS)
def test_cached_step_equals_uncached_forward(backend, new, ids, calls):
    cached, full = cached_and_uncached(build(f"attn_zoo_{backend}"), ids, new)
    torch.testing.assert_close(cached, full, atol=ATOL, rtol=0)
    # the cached step: new queries against all keys (one query: maskless, bottom-right; more:
    # transformers' mask, which carries the alignment)
    backend_, n, m, mask_given, causal = calls[2 * CONFIG.num_hidden_layers - 1]  # after prefill
    assert backend_ == backend
    assert (n, m) == (new, LENGTH)
    assert (mask_given, causal) == ((False, "bottom_right") if new == 1 else (True, False))


def test_top_left_alignment_would_be_caught(monkeypatch, ids):
    """The check above can fail: a cached step run top-left (query 0 sees key 0 only) is off."""
    monkeypatch.setattr(zt, "causal_flag", lambda n, m: True)
    cached, full = cached_and_uncached(build("attn_zoo_chunked"), ids, 1)
    assert max_diff(cached, full) > 1e-2


def test_static_cache_prefill_needs_our_mask_function(monkeypatch, hf, ids):
    """With transformers' own sdpa_mask the static-cache prefill gets no mask (it relies on
    top-left alignment with more keys than queries) and the maskless rule, bottom-right, would
    attend to the cache's unwritten slots: our mask function builds that mask."""
    monkeypatch.setitem(AttentionMaskInterface._global_mapping, "attn_zoo_chunked", sdpa_mask)
    kwargs = dict(max_new_tokens=4, do_sample=False, cache_implementation="static")
    kwargs |= dict(return_dict_in_generate=True, output_logits=True)
    ours = build("attn_zoo_chunked").generate(ids, **kwargs)
    ref = hf["sdpa"].generate(ids, **kwargs)
    assert max_diff(ours.logits[0], ref.logits[0]) > 1e-2


# --- training ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["naive", "chunked", "sdpa"])
def test_loss_and_gradients_match_hf_sdpa(backend, hf, ids, left_padded):
    def loss_and_grads(model):
        model.train()
        out = model(ids, attention_mask=left_padded, labels=ids)
        out.loss.backward()
        return out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    loss, grads = loss_and_grads(build(f"attn_zoo_{backend}"))
    ref_loss, ref_grads = loss_and_grads(build("sdpa"))
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


# --- (4) registration -------------------------------------------------------------------------


def test_register_returns_the_names_and_is_idempotent(registered):
    backends = list(family("softmax").backends)
    assert {"naive", "chunked", "sdpa", "flex", "xformers"} <= set(backends)
    assert registered == [f"attn_zoo_{b}" for b in backends]
    functions = {name: AttentionInterface._global_mapping[name] for name in registered}
    assert zt.register() == registered
    assert zt.register("chunked") == ["attn_zoo_chunked"]
    for name in registered:
        assert AttentionInterface._global_mapping[name] is functions[name]  # not re-created
        assert AttentionMaskInterface._global_mapping[name] is zt.build_mask
        assert name in AttentionInterface().valid_keys()


def test_usable_through_from_config_and_set_attn_implementation(ids, hf):
    model = AutoModelForCausalLM.from_config(
        copy.deepcopy(CONFIG), attn_implementation="attn_zoo_naive"
    )
    assert model.config._attn_implementation == "attn_zoo_naive"
    model = build("sdpa")
    model.set_attn_implementation("attn_zoo_chunked")
    assert model.config._attn_implementation == "attn_zoo_chunked"
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf["eager"](ids).logits, atol=ATOL, rtol=0)


def test_unknown_backend_is_refused_before_registering():
    with pytest.raises(ValueError, match="unknown softmax backend: 'chunkd'.*'chunked'"):
        zt.register(["sdpa", "chunkd"])
    assert "attn_zoo_chunkd" not in AttentionInterface._global_mapping
    assert "attn_zoo_chunkd" not in AttentionMaskInterface._global_mapping
    # an unregistered name is transformers' own error
    with pytest.raises(ValueError, match="attn_zoo_chunkd"):
        build("attn_zoo_chunkd")


def test_auto_and_tier_names_pick_a_backend_per_call(hf, ids):
    assert zt.register(["auto", "fused"]) == ["attn_zoo_auto", "attn_zoo_fused"]
    with torch.no_grad():
        for name in ("attn_zoo_auto", "attn_zoo_fused"):
            logits = build(name)(ids).logits
            torch.testing.assert_close(logits, hf["eager"](ids).logits, atol=ATOL, rtol=0)


def test_a_backend_that_cannot_serve_says_which_can(ids):
    if family("softmax").status("xformers", "cpu")[0]:
        pytest.skip("xformers serves CPU calls here")
    with pytest.raises(UnsupportedCallError, match="Backends that can: .*sdpa"):
        build("attn_zoo_xformers")(ids)


def test_flex_refuses_cpu_calls_where_it_gave_nan_logits():
    """attn_zoo_flex on CPU gave NaN logits at 40 tokens: now every call names the reason."""
    ids = torch.randint(1, VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    reason = "'flex'.*FlexAttention's CPU path gives wrong results.*Backends that can: .*sdpa"
    with torch.no_grad(), pytest.raises(UnsupportedCallError, match=reason):
        build("attn_zoo_flex")(ids)


# --- the attention function itself ------------------------------------------------------------


class Module(torch.nn.Module):
    is_causal = True


def test_attention_function_layout_gqa_and_alignment():
    """(B, H, N, d) queries, (B, Hkv, M, d) keys -> (B, N, H, d); maskless causal calls are
    bottom-right when N != M, top-left when N == M; is_causal=False overrides the module."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    fn = AttentionInterface._global_mapping["attn_zoo_naive"]
    out, weights = fn(Module(), q, k, v, None, scaling=0.5)
    assert out.shape == (2, 3, 4, 8) and weights is None and out.is_contiguous()
    allowed = causal_mask(3, 7, "cpu", offset=4)  # j <= i + M - N
    expected = softmax_attention(q, k, v, attn_mask=allowed, scale=0.5, backend="naive")
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-6, rtol=0)
    full, _ = fn(Module(), q, k, v, None, scaling=0.5, is_causal=False)
    expected = softmax_attention(q, k, v, scale=0.5, backend="naive")
    torch.testing.assert_close(full, expected.transpose(1, 2), atol=1e-6, rtol=0)
    square, _ = fn(Module(), q, k[:, :, :3], v[:, :, :3], None)
    expected = softmax_attention(q, k[:, :, :3], v[:, :, :3], is_causal=True, backend="naive")
    torch.testing.assert_close(square, expected.transpose(1, 2), atol=1e-6, rtol=0)
    # an additive mask (transformers' 0 / finfo.min convention) equals the boolean one
    additive = torch.zeros(3, 7).masked_fill(~allowed, torch.finfo(torch.float32).min)
    by_float, _ = fn(Module(), q, k, v, additive[None, None], scaling=0.5)
    by_bool, _ = fn(Module(), q, k, v, allowed[None, None], scaling=0.5)
    torch.testing.assert_close(by_float, by_bool, atol=1e-6, rtol=0)


@pytest.mark.parametrize("extra", [3, -2])
def test_a_mask_over_other_positions_than_the_keys_is_refused_by_name(extra):
    """A mask 3 keys longer than the 9 keys given was cut to its first 9 columns: with the
    keys the last 9 positions, padding at positions 0-2 masked 3 real keys (0.51 off);
    transformers' eager and sdpa refuse it. Shorter is refused too; 1 broadcasts."""
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 9, 8)
    fn = AttentionInterface._global_mapping["attn_zoo_naive"]
    mask = torch.ones(1, 1, 1, 9 + extra, dtype=torch.bool)
    mask[..., :3] = False
    shape = re.escape(str(tuple(mask.shape)))
    with pytest.raises(ValueError, match=rf"^attention_mask {shape}: .* the 9 keys given"):
        fn(Module(), q, k, k, mask)
    out, _ = fn(Module(), q, k, k, torch.ones(1, 1, 1, 1, dtype=torch.bool))
    torch.testing.assert_close(out, fn(Module(), q, k, k, None)[0])


@pytest.mark.parametrize("kwarg", ["softcap", "s_aux", "position_bias"])
def test_features_we_do_not_implement_are_refused(kwarg):
    q = torch.randn(1, 2, 3, 4)
    fn = AttentionInterface._global_mapping["attn_zoo_naive"]
    with pytest.raises(NotImplementedError, match=kwarg):
        fn(Module(), q, q, q, None, **{kwarg: torch.ones(1)})


def test_module_imports_without_transformers():
    script = textwrap.dedent(
        """
        import importlib.abc, sys

        class NoTransformers(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] == "transformers":
                    raise ModuleNotFoundError("No module named 'transformers'", name=name)

        sys.meta_path.insert(0, NoTransformers())
        import attn_zoo.interop.transformers as zt
        try:
            zt.register()
        except ModuleNotFoundError:
            print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


def test_the_old_module_path_still_registers_with_a_deprecation_warning():
    """attn_zoo.integrations.transformers, where register() lived before interop/ and
    integrations/ became one package, still gives the same functions."""
    import attn_zoo.integrations.transformers as old

    with pytest.warns(DeprecationWarning, match="attn_zoo.interop.transformers"):
        assert old.register is zt.register
