"""Distillation after attention surgery (attn_zoo/interop/distill.py) on the tiny random Llama
and Qwen2 of tests/test_surgery.py: `standard` in place of the original has transfer loss 0
and every other mechanism more; transfer steps lower it and change nothing but the swapped
attentions; each stage trains exactly its parameters (peft's adapters for "lora"), and a
LoRA-fine-tuned student saves and loads once its adapters are merged; bad arguments are
refused by name before anything changes."""

import copy
import math

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

import test_surgery  # noqa: E402
from test_surgery import KWARGS, PAD, VOCAB, tiny  # noqa: E402

import attn_zoo as az  # noqa: E402
from attn_zoo.interop.distill import (  # noqa: E402
    STAGES,
    distil,
    merge_adapters,
    set_trainable,
    transfer_loss,
)
from attn_zoo.interop.surgery import load_swapped, swap_attention  # noqa: E402

ids, left_padded = test_surgery.ids, test_surgery.left_padded  # its fixtures: tokens, padding


def pair(mechanism: str, model_type="llama", dtype=torch.float32, layers=(1,), **kwargs):
    """A teacher (sdpa: eager float64 leaves NaN on padded rows) and its student: a copy with
    `layers` swapped to `mechanism`."""
    teacher = tiny(model_type, dtype, "sdpa")
    kwargs = {**KWARGS.get(mechanism, {}), **kwargs}
    student = swap_attention(copy.deepcopy(teacher), mechanism, layers=list(layers), **kwargs)
    return teacher, student


def state(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# --- the transfer loss -------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_standard_in_place_of_the_original_has_transfer_loss_zero(model_type, ids, left_padded):
    """float64, in train mode, padded or not: the swapped layers get the teacher's inputs (a
    student whose unswapped layer 0 differs still scores 0 on layer 1) and give its outputs."""
    teacher, student = pair("standard", model_type, torch.float64, layers=(0, 1))
    student.train()
    for mask in (None, left_padded):
        assert transfer_loss(teacher, student, ids, mask) < 1e-20
    teacher, student = pair("standard", model_type, torch.float64, layers=(1,))
    with torch.no_grad():
        for p in student.model.layers[0].parameters():
            p.normal_()
    assert transfer_loss(teacher, student, ids, left_padded) < 1e-20
    with torch.no_grad():  # the check can fail: layer 1's queries changed
        student.model.layers[1].self_attn.mechanism.wq.weight.normal_()
    assert transfer_loss(teacher, student, ids, left_padded) > 1e-3


MECHANISMS = ["linear", "gla", "sigmoid", "differential", "dual", "relational", "softcapped"]


@pytest.mark.parametrize("mechanism", [*MECHANISMS, "sliding_window"])
def test_other_mechanisms_have_a_positive_transfer_loss_reaching_them_only(
    mechanism, ids, left_padded, request
):
    """The loss is finite and positive, and its gradients reach the swapped layer only
    (sliding_window: examples/sliding_window.py, a window shorter than the sequence)."""
    kwargs = {}
    if mechanism == "sliding_window":
        request.getfixturevalue("example_plugin")
        kwargs = dict(window=3)
    teacher, student = pair(mechanism, **kwargs)
    mask = None if mechanism == "gla" else left_padded  # gla takes no padding mask
    loss = transfer_loss(teacher, student.train(), ids, mask)
    assert torch.isfinite(loss) and loss > 1e-3
    loss.backward()
    reached = {n for n, p in student.named_parameters() if p.grad is not None}
    assert reached and all(n.startswith("model.layers.1.self_attn.mechanism.") for n in reached)
    assert all(p.grad is None for p in teacher.parameters())


def test_padding_is_left_out_of_the_transfer_loss(ids):
    """Right padding (padding rows see real keys, so their outputs are far from 0): other
    tokens at the padded positions give the same loss; counted as real, another."""
    teacher, student = pair("linear", layers=(0, 1))
    right_padded = torch.ones_like(ids)
    right_padded[1, -PAD:] = 0
    loss = transfer_loss(teacher, student, ids, right_padded)
    other = ids.clone()
    other[1, -PAD:] = (other[1, -PAD:] + 7) % VOCAB
    torch.testing.assert_close(transfer_loss(teacher, student, other, right_padded), loss)
    assert not torch.allclose(transfer_loss(teacher, student, other), loss)


@pytest.mark.parametrize("mechanism, model_type", [("linear", "llama"), ("gla", "qwen2")])
def test_transfer_steps_lower_the_loss_and_change_only_the_swapped_attention(
    mechanism, model_type, ids
):
    torch.manual_seed(0)
    teacher, student = pair(mechanism, model_type)
    before_teacher, before_student = state(teacher), state(student)
    first = transfer_loss(teacher, student, ids).item()
    seen = []
    losses = distil(
        teacher, student, [ids], transfer_steps=4, finetune_steps=0, lr=1e-2,
        on_step=lambda *step: seen.append(step),
    )  # fmt: skip
    assert losses["finetune"] == [] and len(losses["transfer"]) == 4
    assert [s[:2] for s in seen] == [("transfer", i) for i in range(1, 5)]
    assert losses["transfer"][0] == pytest.approx(first)
    assert transfer_loss(teacher, student, ids).item() < first
    changed = {n for n, p in student.named_parameters() if not torch.equal(p, before_student[n])}
    assert changed and all(n.startswith("model.layers.1.self_attn.mechanism.") for n in changed)
    assert all(torch.equal(p, before_teacher[n]) for n, p in teacher.named_parameters())


def test_a_teacher_whose_padded_outputs_are_nan_is_refused(ids, left_padded):
    """transformers' eager attention in float64 leaves NaN on a padded row, which reaches the
    real tokens of the next layer: no target, said rather than a NaN loss."""
    teacher = tiny("llama", torch.float64)  # eager
    student = swap_attention(copy.deepcopy(teacher), "linear")
    with pytest.raises(ValueError, match="layer 1 attention output is not finite.*sdpa"):
        transfer_loss(teacher, student, ids, left_padded)


# --- what each stage trains --------------------------------------------------------------


SWAPPED = "model.layers.1.self_attn.mechanism."
GLA_OWN = {"gate.0.weight", "gate.1.weight", "gate.1.bias", "wg.weight", "norm.weight"}
PROJECTIONS = ("wq", "wk", "wv", "wo")
EXPECTED = {  # stage -> the trainable parameters of a llama with gla in layer 1
    "transfer": {SWAPPED + n for n in GLA_OWN | {f"{w}.weight" for w in PROJECTIONS}},
    "lora": {SWAPPED + n for n in GLA_OWN}
    | {f"{SWAPPED}{w}.lora_{ab}.default.weight" for w in PROJECTIONS for ab in "AB"},
}
EXPECTED["attention"] = EXPECTED["transfer"]


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_trains_its_parameters_and_gradients_reach_those_only(stage, ids):
    _, student = pair("gla")
    trained = set_trainable(student, stage, lora_rank=2)
    names = {n for n, p in student.named_parameters() if p.requires_grad}
    assert names == EXPECTED.get(stage, {n for n, _ in student.named_parameters()})
    assert {id(p) for p in trained} == {id(p) for n, p in student.named_parameters() if n in names}
    student(ids, labels=ids).loss.backward()
    assert {n for n, p in student.named_parameters() if p.grad is not None} == names
    if stage == "lora":  # rank 2 adapters, B starting at 0
        wq = student.model.layers[1].self_attn.mechanism.wq
        assert wq.lora_A["default"].weight.shape == (2, 64)
        assert not wq.lora_B["default"].weight.any()


def test_lora_fine_tuning_merges_saves_and_loads(ids, tmp_path):
    """distil with "lora" (Qwen2: biased projections; linear attention adds no parameter):
    the adapters train and are merged at the end, so exactly the adapted projections' weights
    moved (not their biases, nor the rest of the model), and the student saves and loads as
    any swapped model, giving the same logits."""
    teacher, student = pair("linear", "qwen2", layers=(0, 1))
    before = state(student)
    losses = distil(teacher, student, [ids], transfer_steps=0, finetune_steps=3, lr=1e-2,
                    finetune="lora")  # fmt: skip
    assert len(losses["finetune"]) == 3 and all(map(math.isfinite, losses["finetune"]))
    assert not hasattr(student, "peft_config")
    changed = {n for n, p in student.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {
        f"model.layers.{i}.self_attn.mechanism.{w}.weight" for i in (0, 1) for w in PROJECTIONS
    }
    student.eval().save_pretrained(tmp_path)
    again = load_swapped(tmp_path, attn_implementation="sdpa")
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, student(ids).logits, atol=0, rtol=0)


@pytest.mark.parametrize("finetune", ["attention", "all"])
def test_fine_tuning_trains_the_stages_parameters(finetune, ids):
    teacher, student = pair("gla")
    before = state(student)
    seen = []
    distil(teacher, student, [ids, ids[:1]], transfer_steps=0, finetune_steps=3, lr=1e-2,
           finetune=finetune, on_step=lambda *step: seen.append(step))  # fmt: skip
    assert [s[:2] for s in seen] == [("finetune", i) for i in (1, 2, 3)]
    changed = {n for n, p in student.named_parameters() if not torch.equal(p, before[n])}
    assert changed == EXPECTED.get(finetune, set(before))


def test_merging_keeps_the_adapted_logits(ids, tmp_path):
    """Merged adapters give the adapted logits; unmerged ones do not fit load_swapped."""
    _, student = pair("gla")
    with torch.no_grad():
        plain = student(ids).logits
        set_trainable(student, "lora", lora_rank=2)
        for name, p in student.named_parameters():
            if "lora_B" in name:
                p.normal_()
        adapted = student(ids).logits
        student.save_pretrained(tmp_path)
        merged = merge_adapters(student)(ids).logits
    assert not torch.allclose(adapted, plain)
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"do not fit the swapped model.*lora_A"):
        load_swapped(tmp_path)


def test_lora_again_keeps_the_adapters_of_the_same_rank_only():
    _, student = pair("gla")
    first = set(map(id, set_trainable(student, "lora", lora_rank=2, lora_alpha=4.0)))
    assert set(map(id, set_trainable(student, "lora", lora_rank=2, lora_alpha=4.0))) == first
    with pytest.raises(ValueError, match=r"lora_rank=4.*adapters of rank 2, alpha 4\.0.*merge"):
        set_trainable(student, "lora", lora_rank=4, lora_alpha=4.0)


@pytest.mark.parametrize("stage", ["transfer", "attention"])
def test_a_stage_after_lora_trains_the_projections_not_the_adapters(stage, ids):
    """Adapters injected first (as ablations/grid/teacher.py does): "transfer" and "attention"
    train what they train without them (the projections W under their base_layer name), and
    a transfer step leaves the adapters as they were; "lora" again trains them."""
    teacher, student = pair("gla")
    set_trainable(student, "lora", lora_rank=2)
    trained = set_trainable(student, stage)
    names = {n for n, p in student.named_parameters() if p.requires_grad}
    adapted = {f"{SWAPPED}{w}.weight": f"{SWAPPED}{w}.base_layer.weight" for w in PROJECTIONS}
    assert names == {adapted.get(n, n) for n in EXPECTED[stage]}
    before = state(student)
    optimizer = torch.optim.AdamW(trained, lr=1e-2)
    transfer_loss(teacher, student, ids).backward()
    optimizer.step()
    changed = {n for n, p in student.named_parameters() if not torch.equal(p, before[n])}
    assert changed == names
    set_trainable(student, "lora", lora_rank=2)
    assert {n for n, p in student.named_parameters() if p.requires_grad} == EXPECTED["lora"]


# --- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(stage="transfr"), r"stage='transfr': must be one of transfer, attention, lora, all"),
        (dict(stage="lora", lora_rank=0), r"lora_rank=0: must be an integer >= 1"),
        (dict(stage="lora", lora_alpha=-1.0), r"lora_alpha=-1\.0: must be a positive number"),
    ],
)
def test_set_trainable_refuses_bad_arguments_before_any_change(kwargs, message):
    _, student = pair("gla")
    with pytest.raises(ValueError, match=message):
        set_trainable(student, **kwargs)
    assert all(p.requires_grad for p in student.parameters())
    assert not hasattr(student, "peft_config")


def test_lora_on_a_mechanism_without_the_projections_it_adapts_is_refused():
    """A plugin whose one projection is named `w`: nothing for the adapters to sit on."""

    @az.register_mechanism("causal_sum")
    class CausalSum(az.AttentionMechanism):
        def __init__(self, d_model: int, n_heads: int, backend: str = "auto"):
            super().__init__(backend)
            self.w = torch.nn.Linear(d_model, d_model)

        def forward(self, x, symbols=None, attn_mask=None, is_causal=False):
            return self.w(x).cumsum(dim=1)

    _, student = pair("causal_sum")
    with pytest.raises(
        ValueError, match="CausalSum has no nn.Linear projection named.*'attention'"
    ):
        set_trainable(student, "lora")
    assert {n for n, p in student.named_parameters() if p.requires_grad} == {
        n for n, _ in student.named_parameters()
    }


def test_a_model_with_no_swapped_layer_is_refused(ids):
    teacher = tiny("llama")
    with pytest.raises(ValueError, match="no swapped attention layer: swap_attention"):
        set_trainable(teacher, "attention")
    with pytest.raises(ValueError, match="no swapped attention layer"):
        transfer_loss(tiny("llama"), teacher, ids)


def test_a_teacher_that_is_not_the_students_original_is_refused(ids):
    teacher, student = pair("gla")
    with pytest.raises(ValueError, match="teacher and student are the same model"):
        transfer_loss(student, student, ids)
    other = tiny("qwen2")
    with pytest.raises(ValueError, match="model_type: teacher 'qwen2', student 'llama'"):
        transfer_loss(other, student, ids)
    config = type(teacher.config)(**{**teacher.config.to_dict(), "num_hidden_layers": 1})
    shallow = type(teacher)._from_config(config, attn_implementation="sdpa")
    with pytest.raises(
        ValueError, match=r"num_hidden_layers: teacher 1, student 2.*swapped layers \[1\] are not"
    ):
        transfer_loss(shallow, student, ids)


@pytest.mark.parametrize(
    "call, message",
    [
        (dict(transfer_steps=-1), r"transfer_steps=-1: must be an integer >= 0"),
        (dict(finetune_steps=1.5), r"finetune_steps=1\.5: must be an integer >= 0"),
        (dict(lr=0.0), r"lr=0\.0: must be a positive number"),
        (dict(finetune="transfer"), r"finetune='transfer': must be one of attention, lora, all"),
        (dict(batches=[]), r"batches: yielded no batch"),
        (dict(batches=[torch.rand(2, 8)]), r"token ids \(B, N\).*\(2, 8\) torch\.float32"),
    ],
)
def test_distil_refuses_bad_arguments_by_name(call, message, ids):
    teacher, student = pair("gla")
    before = state(student)
    arguments = {**dict(batches=[ids], transfer_steps=1, finetune_steps=1, lr=1e-3), **call}
    with pytest.raises(ValueError, match=message):
        distil(teacher, student, **arguments)
    assert all(torch.equal(p, before[n]) for n, p in student.named_parameters())


@pytest.mark.parametrize(
    "inputs, message",
    [
        (lambda ids: (ids.float(), None), r"input_ids \(2, 8\) torch\.float32: must be token"),
        (lambda ids: (ids, torch.ones(2, 7)), r"attention_mask \(2, 7\): must be \(B, N\)"),
        (lambda ids: (ids, torch.zeros(2, 8)), r"1 at real tokens \(at least one\)"),
    ],
)
def test_transfer_loss_refuses_bad_inputs_by_name(inputs, message, ids):
    teacher, student = pair("linear")
    with pytest.raises(ValueError, match=message):
        transfer_loss(teacher, student, *inputs(ids))
