"""The library under the ninth hostile pass (issue 38, no silent wrong answer), each as it
failed: sigmoid attention with the paper's bias swapped into a model counted a padded
prompt's padding as keys (b = -log n: the prompt's logits 1.54 off its own alone)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from test_surgery import tiny  # noqa: E402

from attn_zoo.interop.surgery import swap_attention  # noqa: E402


def test_a_swapped_sigmoid_layer_gives_a_padded_prompt_its_logits_alone():
    """Sigmoid attention (bias=None: b = -log n) swapped into a tiny float64 Llama: a prompt
    of 8 padded by 5 on the right, or on the left (its position_ids 0..7), gives at its real
    tokens the logits it gets alone, to 1e-12."""
    model = swap_attention(tiny("llama", torch.float64), "sigmoid").eval()
    prompt = torch.randint(1, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(1, 5, dtype=torch.long)
    real = torch.ones(1, 8, dtype=torch.long)
    with torch.no_grad():
        alone = model(prompt).logits[0]
        right = model(torch.cat([prompt, pad], 1), attention_mask=torch.cat([real, pad], 1))
        left = model(
            torch.cat([pad, prompt], 1),
            attention_mask=torch.cat([pad, real], 1),
            position_ids=torch.cat([pad, torch.arange(8).view(1, 8)], 1),
        )
    torch.testing.assert_close(right.logits[0, :8], alone, atol=1e-12, rtol=0)
    torch.testing.assert_close(left.logits[0, 5:], alone, atol=1e-12, rtol=0)
