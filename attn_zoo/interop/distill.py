"""Distillation after attention surgery: the two-stage recipe of the linearising literature
(LoLCATs, Hedgehog, "Linearizing LLMs"): the swapped layers of a student first learn to give
the attention outputs of the frozen original (attention transfer), then the student is
fine-tuned on next-token loss.

    from attn_zoo.interop.distill import distil
    from attn_zoo.interop.surgery import swap_attention
    student = swap_attention(copy.deepcopy(teacher), "gla", layers=[2, 3])
    losses = distil(teacher, student, batches, transfer_steps=200, finetune_steps=100,
                    lr=1e-3, finetune="lora")      # {"transfer": [...], "finetune": [...]}

or, in a training loop of one's own, `set_trainable` (what a stage trains: `STAGES`) and
`transfer_loss` (stage "transfer"; the others train on the model's own next-token loss).

- Attention transfer (`transfer_loss`): the teacher runs under no_grad; forward hooks on its
  decoder layers' ``self_attn`` record each layer's input (hidden states (B, N, D), the
  rotary tables (cos, sin), the 4-D mask) and output (B, N, D). The student's swapped layer
  i is called on the teacher's input to layer i, not on its own hidden states, so every layer
  learns independently of the others (the standard practice of LoLCATs and Hedgehog), and
  the loss is the mean over the swapped layers of MSE(student_i, teacher_i) over the real
  tokens' outputs (padding rows excluded). The student's other layers are not run.
- Fine-tuning: stage "attention" trains the swapped mechanisms whole, "all" every parameter,
  "lora" low-rank adapters (peft's `LoraConfig`, injected in place by
  `peft.inject_adapter_in_model`) on the swapped mechanisms' projections that start from
  the model's q, k, v, o (the nn.Linear named wq, wq_attn, wk, wk_attn, wv, wo: surgery's
  `PROJECTIONS`, at any depth, so dual attention's branches' too), those projections
  frozen, plus every other parameter of the swapped mechanisms whole (what the mechanism adds
  to softmax attention: feature maps, gates, lambda, relation projections, symbols), as
  LoLCATs trains its feature maps next to its adapters. `merge_adapters` folds the adapters
  into the projections, after which ``save_pretrained`` / `load_swapped` work as before
  (`distil` merges them at its end).

peft is imported only inside the functions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable

import torch
from torch import nn

from attn_zoo.interop.surgery import PROJECTIONS, SwappedAttention, decoder_layers
from attn_zoo.mechanisms.base import check_int

STAGES = ("transfer", "attention", "lora", "all")
FINETUNE = STAGES[1:]  # the stages `distil` fine-tunes with
# the configs a teacher and its student must share
SHARED = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)
ADAPTED = {name for names in PROJECTIONS.values() for name in names}  # "lora" adapts these


def swapped_layers(student: nn.Module) -> dict[int, SwappedAttention]:
    """{layer index: `SwappedAttention`} of `student`; ValueError when it has none."""
    layers = {
        i: block.self_attn
        for i, block in enumerate(decoder_layers(student))
        if isinstance(block.self_attn, SwappedAttention)
    }
    if not layers:
        raise ValueError(
            f"the student ({type(student).__name__}) has no swapped attention layer: "
            "swap_attention(student, mechanism, layers=...) first"
        )
    return layers


def check_pair(teacher: nn.Module, student: nn.Module) -> dict[int, SwappedAttention]:
    """The student's swapped layers, after checking that `teacher` is another model of the
    same architecture (`SHARED` config fields) holding every swapped layer index."""
    if teacher is student:
        raise ValueError(
            "teacher and student are the same model: swap a copy (copy.deepcopy(teacher), or "
            "the teacher loaded again) and keep the original as the teacher"
        )
    teacher_layers = decoder_layers(teacher)
    swapped = swapped_layers(student)
    reasons = [
        f"{name}: teacher {getattr(teacher.config, name, None)!r}, student "
        f"{getattr(student.config, name, None)!r}"
        for name in SHARED
        if getattr(teacher.config, name, None) != getattr(student.config, name, None)
    ]
    missing = [i for i in swapped if i >= len(teacher_layers)]
    if missing:
        reasons.append(
            f"the student's swapped layers {missing} are not among the teacher's "
            f"{len(teacher_layers)} decoder layers"
        )
    if reasons:
        raise ValueError(
            f"the teacher does not fit the student: {'; '.join(reasons)} (distil a student "
            "swapped from a copy of the teacher)"
        )
    return swapped


def real_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, N) bool, True at real tokens (every token when attention_mask is None), after
    checking input_ids (B, N) integers and attention_mask (B, N) (1 = a real token, 0 =
    padding) or None."""
    if input_ids.dim() != 2 or input_ids.is_floating_point() or input_ids.is_complex():
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} {input_ids.dtype}: must be token ids (B, N), "
            "an integer tensor"
        )
    if attention_mask is None:
        return torch.ones_like(input_ids, dtype=torch.bool)
    if attention_mask.shape != input_ids.shape or not attention_mask.any():
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)}: must be (B, N) = "
            f"{tuple(input_ids.shape)} like input_ids, 1 at real tokens (at least one) and 0 "
            "at padding"
        )
    return attention_mask.to(device=input_ids.device) != 0


def transfer_loss(
    teacher: nn.Module,
    student: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scalar: mean over the student's swapped layers i of MSE(student_i(h_i), teacher_i(h_i)),
    h_i the teacher's hidden states (B, N, D) entering layer i's self-attention (with its
    rotary tables and 4-D mask: positions and masks as the model's), teacher_i its frozen
    self-attention (run under no_grad), student_i the swapped attention; the squared error
    is averaged over the D features of the real tokens (attention_mask (B, N): 1 = real,
    0 = padding; None: all real). Gradients reach the swapped attentions only; the student's
    other layers are not run (module docstring). input_ids (B, N) int."""
    swapped = check_pair(teacher, student)
    real = real_tokens(input_ids, attention_mask)
    blocks = decoder_layers(teacher)
    seen: dict[int, tuple[dict, torch.Tensor]] = {}

    def record(i: int):
        def hook(module, args, kwargs, output):
            seen[i] = (kwargs, output[0])

        return hook

    hooks = [
        blocks[i].self_attn.register_forward_hook(record(i), with_kwargs=True) for i in swapped
    ]
    try:
        with torch.no_grad():
            getattr(teacher, "model", teacher)(
                input_ids, attention_mask=attention_mask, use_cache=False
            )
    finally:
        for hook in hooks:
            hook.remove()
    losses = []
    for i, attention in swapped.items():
        kwargs, target = seen[i]
        target = target[real]
        if not target.isfinite().all():
            raise ValueError(
                f"the teacher's layer {i} attention output is not finite at real tokens: no "
                "target to learn (transformers' eager attention in float64 on a padded batch "
                "overflows its mask, for one: load the teacher with attn_implementation='sdpa')"
            )
        out, _ = attention(
            hidden_states=kwargs["hidden_states"],
            position_embeddings=kwargs["position_embeddings"],
            attention_mask=kwargs.get("attention_mask"),
        )
        losses.append((out[real] - target).pow(2).mean())
    return torch.stack(losses).mean()


def check_positive(name: str, value: object) -> None:
    """ValueError naming `name` unless `value` is a finite number > 0 (bools are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"{name}={value!r}: must be a positive number")


def set_trainable(
    student: nn.Module, stage: str, lora_rank: int = 8, lora_alpha: float = 16.0
) -> list[nn.Parameter]:
    """Freeze every parameter of `student`, then unfreeze what `stage` trains: "transfer" and
    "attention" the swapped layers' mechanisms (every parameter of each, but the adapters of
    a student that holds them: their projections W train as without adapters); "lora"
    low-rank adapters W x + (lora_alpha / lora_rank) B A x, A (lora_rank, d_in), B (d_out,
    lora_rank) starting at 0, injected by peft on the mechanisms' projections wq, wq_attn, wk,
    wk_attn, wv, wo (W frozen), plus every other parameter of the mechanisms (module
    docstring; adapters already injected are kept if their rank and alpha are these); "all"
    every parameter. So a "transfer" after a "lora" call (ablations/grid/teacher.py injects
    the adapters first) trains what it trains before one (`distil`). Returns the trainable
    parameters (for the optimizer). ValueError for another stage, a student with no swapped
    layer, a bad rank or alpha, or no projection to adapt."""
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r}: must be one of {', '.join(STAGES)}")
    check_int("lora_rank", lora_rank)
    check_positive("lora_alpha", lora_alpha)
    swapped = swapped_layers(student)
    if stage == "lora":
        add_adapters(student, swapped, lora_rank, lora_alpha)
    student.requires_grad_(stage == "all")
    for attention in swapped.values():
        attention.requires_grad_(True)
    for adapted in adapter_layers(student):  # adapters train in "lora" and "all", W but in "lora"
        adapted.requires_grad_(stage in ("lora", "all"))
        adapted.get_base_layer().requires_grad_(stage != "lora")
    return [p for p in student.parameters() if p.requires_grad]


def adapter_layers(student: nn.Module) -> list[nn.Module]:
    """The peft LoRA layers of `student` (none, peft not imported, without a `peft_config`:
    a student that never held adapters, or had them merged)."""
    if not hasattr(student, "peft_config"):
        return []
    from peft.tuners.lora import LoraLayer

    return [m for m in student.modules() if isinstance(m, LoraLayer)]


def add_adapters(
    student: nn.Module, swapped: dict[int, SwappedAttention], rank: int, alpha: float
) -> None:
    """Inject peft LoRA layers on the swapped mechanisms' `ADAPTED` projections of `student`,
    unless the student holds adapters of this rank and alpha already."""
    from peft import LoraConfig, inject_adapter_in_model

    injected = getattr(student, "peft_config", {}).get("default")
    if injected is None:
        names = [
            f"layers.{i}.self_attn.{name}"  # peft matches the end of a module's name
            for i, attention in swapped.items()
            for name, module in attention.named_modules()
            if name.rpartition(".")[2] in ADAPTED and isinstance(module, nn.Linear)
        ]
        if not names:
            mechanisms = sorted({type(a.mechanism).__name__ for a in swapped.values()})
            raise ValueError(
                f"stage 'lora': {', '.join(mechanisms)} has no nn.Linear projection named "
                f"{', '.join(sorted(ADAPTED))} to adapt: fine-tune with stage 'attention'"
            )
        config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=names)
        inject_adapter_in_model(config, student)
    elif (injected.r, injected.lora_alpha) != (rank, alpha):
        raise ValueError(
            f"lora_rank={rank}, lora_alpha={alpha}: the student holds adapters of rank "
            f"{injected.r}, alpha {injected.lora_alpha} already (merge_adapters first)"
        )


def merge_adapters(student: nn.Module) -> nn.Module:
    """`student` with every peft adapter folded into its projection (W + (alpha / rank) B A)
    and the projection put back as the plain nn.Linear it was, in place: it then saves with
    ``save_pretrained`` and loads with `load_swapped`. Returns `student` (unchanged without
    adapters)."""
    from peft.tuners.lora import LoraLayer

    adapted = [(name, m) for name, m in student.named_modules() if isinstance(m, LoraLayer)]
    for name, layer in adapted:
        layer.merge()
        parent, _, attribute = name.rpartition(".")
        setattr(student.get_submodule(parent), attribute, layer.get_base_layer())
    if hasattr(student, "peft_config"):
        del student.peft_config
    return student


def distil(
    teacher: nn.Module,
    student: nn.Module,
    batches: Iterable[torch.Tensor],
    *,
    transfer_steps: int,
    finetune_steps: int,
    lr: float,
    finetune: str = "attention",
    on_step: Callable[[str, int, float], None] | None = None,
) -> dict[str, list[float]]:
    """The whole recipe: `transfer_steps` AdamW(lr) steps of `transfer_loss` training the
    swapped attentions, then `finetune_steps` of the student's next-token loss training what
    stage `finetune` ("attention", "lora" or "all": `set_trainable`) trains, on `batches` of
    token ids (B, N) (unpadded), cycled. The teacher is put in eval mode, the student in train
    mode; with "lora" the adapters are merged at the end (`merge_adapters`). on_step(stage,
    step, loss) after each step ("transfer" or "finetune", step from 1). Returns {"transfer":
    [losses], "finetune": [losses]}."""
    check_int("transfer_steps", transfer_steps, low=0)
    check_int("finetune_steps", finetune_steps, low=0)
    check_positive("lr", lr)
    if finetune not in FINETUNE:
        raise ValueError(f"finetune={finetune!r}: must be one of {', '.join(FINETUNE)}")
    check_pair(teacher, student)
    teacher.eval()
    student.train()
    cycled = itertools.cycle(batches)
    losses: dict[str, list[float]] = {"transfer": [], "finetune": []}
    for stage, steps in (("transfer", transfer_steps), ("finetune", finetune_steps)):
        if steps == 0:
            continue
        trained = set_trainable(student, "transfer" if stage == "transfer" else finetune)
        optimizer = torch.optim.AdamW(trained, lr=lr)
        for step in range(1, steps + 1):
            ids = next_batch(cycled)
            if stage == "transfer":
                loss = transfer_loss(teacher, student, ids)
            else:
                loss = student(ids, labels=ids, use_cache=False).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses[stage].append(loss.item())
            if on_step is not None:
                on_step(stage, step, loss.item())
    if finetune == "lora":
        merge_adapters(student)
    return losses


def next_batch(batches: Iterable[torch.Tensor]) -> torch.Tensor:
    """The next batch of the cycled `batches`: token ids (B, N), an integer tensor."""
    ids = next(iter(batches), None)
    if ids is None:
        raise ValueError("batches: yielded no batch (give at least one (B, N) token id tensor)")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        got = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids)
        raise ValueError(
            f"batches: each batch must be token ids (B, N), an integer tensor; got {got}"
        )
    return ids


__all__ = ["STAGES", "distil", "merge_adapters", "set_trainable", "transfer_loss"]
