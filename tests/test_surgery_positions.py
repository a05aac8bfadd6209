"""Swapped layers reading absolute positions (attn_zoo/interop/surgery.py,
`SwappedAttention.check_positions`): a mechanism that reads them (a mask or score mod not
declaring `relative`, attn_zoo/kernels/softmax/mods.py; positional symbols) counts a call's
positions as 0..N-1, so a left-padded prompt (or position_ids of another range) would read the
padding as positions: logits 5.2 (prefix_lm) and 6.7 (positional symbols) off the prompt's
alone, silently. Such calls are refused by name; relative mods and the model's RoPE serve
them exactly."""

import copy

import pytest
import torch

pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from attn_zoo.interop.surgery import swap_attention  # noqa: E402

SIZES = dict(
    vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    initializer_range=0.2, pad_token_id=0,
)  # fmt: skip
LENGTH, PAD = 8, 3


def user_window(b, h, q_idx, kv_idx):  # a user's mod: undeclared, so taken as absolute
    return (q_idx - kv_idx).abs() < 3


ABSOLUTE = {
    "prefix_lm": ("standard", {"mask_mod": {"name": "prefix_lm", "prefix": 4}}, "prefix_lm"),
    "document": ("standard", {"mask_mod": {"name": "document", "lengths": [4]}}, "document"),
    "positional symbols": (
        "relational",
        {"symbol_retrieval": "positional_symbols", "symbol_retrieval_kwargs": {"max_length": 64}},
        "PositionalSymbolRetriever",
    ),
    "dual's positional symbols": (
        "dual",
        {
            "n_heads_sa": 2,
            "n_heads_ra": 2,
            "symbol_retrieval": "positional_symbols",
            "symbol_retrieval_kwargs": {"max_length": 64},
        },
        "PositionalSymbolRetriever",
    ),  # fmt: skip
}
RELATIVE = {
    "standard": ("standard", {}),
    "sliding_window and alibi": (
        "standard",
        {"mask_mod": {"name": "sliding_window", "window": 3}, "score_mod": "alibi"},
    ),
    "softcap": ("softcapped", {"cap": 5.0}),
}


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SIZES)).double().eval()


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(1, 64, (1, LENGTH), generator=torch.Generator().manual_seed(1))


def left_padded(prompt):
    """The prompt behind PAD padding tokens, its mask and the positions generate gives it."""
    ids = torch.cat([torch.zeros(1, PAD, dtype=torch.long), prompt], 1)
    mask = torch.cat([torch.zeros(1, PAD, dtype=torch.long), torch.ones_like(prompt)], 1)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("case", ABSOLUTE)
def test_a_mechanism_reading_absolute_positions_refuses_other_positions(case, base, prompt):
    mechanism, kwargs, named = ABSOLUTE[case]
    model = swap_attention(copy.deepcopy(base), mechanism, **kwargs)
    ids, mask, positions = left_padded(prompt)
    with torch.no_grad():
        model(input_ids=prompt)  # positions 0..N-1: served
        with pytest.raises(ValueError, match=f"layer 0: .*{named}.* reads absolute positions"):
            model(input_ids=ids, attention_mask=mask, position_ids=positions)
        with pytest.raises(ValueError, match="left-padded"):  # the model's plain positions
            model(input_ids=ids, attention_mask=mask)
        with pytest.raises(ValueError, match="position_ids are not 0..7"):
            model(input_ids=prompt, position_ids=torch.arange(5, 5 + LENGTH)[None])
        with pytest.raises(ValueError, match="run each sequence alone"):
            model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False)


def test_an_undeclared_mod_is_taken_as_reading_absolute_positions(base, prompt):
    model = swap_attention(copy.deepcopy(base), "standard", layers=[0])
    model.model.layers[0].self_attn.mechanism.mask_mod = user_window  # not a JSON kwarg
    ids, mask, positions = left_padded(prompt)
    with torch.no_grad(), pytest.raises(ValueError, match="mask_mod user_window reads absolute"):
        model(input_ids=ids, attention_mask=mask, position_ids=positions)


@pytest.mark.parametrize("case", RELATIVE)
def test_relative_positions_serve_a_left_padded_prompt_exactly(case, base, prompt):
    """The original's exactness (1e-15): RoPE and mods declaring `relative` read i - j only."""
    mechanism, kwargs = RELATIVE[case]
    model = swap_attention(copy.deepcopy(base), mechanism, **kwargs)
    ids, mask, positions = left_padded(prompt)
    with torch.no_grad():
        alone = model(input_ids=prompt).logits[0]
        padded = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[0, PAD:]
    torch.testing.assert_close(padded, alone, atol=1e-10, rtol=0)
