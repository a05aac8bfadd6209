"""Cells whose model is a Hugging Face causal LM read from a local folder, the teacher: the
teacher itself, or the teacher with its attention swapped for the cell's mechanism, then
distilled (docs/distillation.md).

    [model]                              # or a [[sizes]], task or mechanism entry's `model`
    teacher = "teachers/llama"           # a save_pretrained folder, beside the grid file
    transfer_steps = 100                 # attention transfer first (default 0)
    finetune = "lora"                    # then next-token loss (default "all"; "none": stop)
    lora_rank = 8                        # the rank of lora's adapters (default 8)

A cell with a `teacher` (`TEACHER_OPTIONS`) builds the model of its config.json (llama, mistral
or qwen2: attn_zoo.interop.surgery.SUPPORTED) with its weights, or with fresh ones drawn from
the cell's seed where `from_scratch` is true (the folder then needs no weights), and swaps
every decoder layer's attention for the cell's mechanism and its kwargs
(attn_zoo.interop.surgery.swap_attention: the model's sizes fill d_model, n_heads, ...);
mechanism "standard" with no kwargs but the teacher's heads is no swap: the teacher's own
attention (`swaps`; standard with more, a sliding-window mask mod say, is swapped in with the
teacher's projections). The cell's size must be the
teacher's (d_model = hidden_size, n_layers = num_hidden_layers), its task a language model of
the teacher's vocabulary; the other model options do not apply (the config sets them).

Training (ablations.run.train) runs in `Stage`s, each an AdamW from fresh moments and its own
LR schedule (warmup, then decay over the stage's steps): steps 1 to `transfer_steps` train
what attn_zoo.interop.distill.set_trainable's "transfer" stage trains on its `transfer_loss`
(each swapped layer's attention output against the frozen teacher's, on the teacher's hidden
states); the remaining steps train the `finetune` stage's parameters on next-token loss (none
with "none": the cell ends after the transfer; "transfer_steps = 0, finetune = 'none'" is the
model right after the swap). The cell's `steps` counts both, so a replacement and a model
trained from scratch see the same number of batches.

A finished cell with a teacher that has weights records `teacher_test_loss` (the teacher's
own test loss, measured in the cell on the same split) and `test_recovered` (`recovered`).
The files of the teacher folder are part of the cell's recorded data files
(ablations.run.provenance), so a changed teacher flags its cells as data files do.

transformers is imported only inside the functions (the demo installs without it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ablations.tasks import IGNORE_INDEX
from attn_zoo.interop import distill
from attn_zoo.interop.distill import adapter_layers, set_trainable
from attn_zoo.interop.surgery import (
    RECORD,
    SUPPORTED,
    load_swapped,
    mechanism_settings,
    swap_attention,
)
from attn_zoo.models.common import some_keys

TEACHER_OPTIONS = ("teacher", "from_scratch", "transfer_steps", "finetune", "lora_rank")
FINETUNE = ("none", *distill.FINETUNE)  # after the transfer: next-token loss on what it trains
NO_SWAP = "standard"  # the mechanism that keeps the teacher's own attention (`swaps`)
HEADS = {"n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads"}
SIZE_KEYS = ("label", "d_model", "n_layers")


class CausalLM(nn.Module):
    """A Hugging Face causal LM `hf` called as the zoo's language models are: x (B, N) token
    ids, targets (B, N) next tokens (`IGNORE_INDEX` where not scored) -> logits (B, N, V) and
    the mean cross-entropy over the scored targets (None without targets), called uncached
    (use_cache=False: training, evaluation and map recording give swapped layers no cache).
    `stages`: how a cell trains it (`Stage`s, in order)."""

    def __init__(self, hf: nn.Module, stages: tuple[Stage, ...] = ()):
        super().__init__()
        self.hf, self.stages = hf, stages

    def forward(self, x: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        logits = self.hf(input_ids=x, use_cache=False).logits
        if targets is None:
            return logits, None
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX
        )
        return logits, loss


@dataclass(frozen=True)
class Stage:
    """A stage of a cell's training: `name` ("transfer", a `FINETUNE` stage, or "all" for a
    model without stages), its last step (the first is the step after the stage before), and
    the names of the parameters it trains (the others frozen; names, not the tensors, so that
    moving the model to a device keeps them)."""

    name: str
    last_step: int
    trains: frozenset[str]


def stages_of(model: nn.Module, steps: int) -> tuple[Stage, ...]:
    """How a cell trains `model` for `steps` steps: a teacher's model's `CausalLM.stages`, else
    one stage training every parameter."""
    if isinstance(model, CausalLM):
        return model.stages
    return (Stage("all", steps, trained_names(model)),)


def trained_names(model: nn.Module) -> frozenset[str]:
    """The names of `model`'s trainable parameters."""
    return frozenset(name for name, p in model.named_parameters() if p.requires_grad)


def swaps(mechanism: str, kwargs: dict) -> bool:
    """Whether a teacher's cell of `mechanism` with `kwargs` swaps the teacher's attention: all
    but `NO_SWAP` with no kwargs besides the teacher's heads (`HEADS`)."""
    return mechanism != NO_SWAP or bool(set(kwargs) - set(HEADS))


def has_teacher(size: dict) -> bool:
    """Whether a cell's size (its model options) names a teacher."""
    return "teacher" in size


def stage_steps(size: dict, steps: int) -> list[tuple[str, int]]:
    """The stages a cell of model options `size` trains in for `steps` steps, in order, as
    (name, last step): ("transfer", model.transfer_steps) where it is set, then the finetune
    stage to `steps` unless model.finetune is "none"; ("all", steps) without a teacher. The one
    place stage boundaries are derived (`build_teacher_model`, `judged_from`, and
    ablations/grid/validate.py's warmup check read them)."""
    if not has_teacher(size):
        return [("all", steps)]
    transfer, finetune = size.get("transfer_steps", 0), size.get("finetune", "all")
    stages = [("transfer", transfer)] if transfer else []
    return stages + ([(finetune, steps)] if finetune != "none" else [])


def judged_from(size: dict) -> int:
    """The first step whose evaluations judge a cell of model options `size` (early stop,
    patience and a search's pruner act in the last stage only: ablations/run/train.py): the
    step after the stage before the last (the transfer, where fine-tuning follows it), else 1."""
    stages = stage_steps(size, 0)
    return stages[-2][1] + 1 if len(stages) > 1 else 1


def teacher_folder(size: dict, folder: str) -> Path:
    """The teacher folder of a cell's size, a relative path taken from the grid file's
    `folder` (a cell's `folder`); ValueError where a relative path has no grid folder to start
    from (a cell read back from a store)."""
    given = Path(size["teacher"]).expanduser()
    if given.is_absolute():
        return given
    if not folder:
        raise ValueError(
            f"model.teacher = {size['teacher']!r} is relative to the grid file's folder, and "
            "this cell has none (it was read back from a store): load its grid"
        )
    return Path(folder) / given


def teacher_files(size: dict, folder: str) -> list[Path]:
    """Every file of the teacher folder (sorted; none without a teacher, or where the folder
    is missing: building the cell's model refuses that), as the cell's data files are
    recorded."""
    path = teacher_folder(size, folder) if has_teacher(size) else None
    if path is None or not path.is_dir():
        return []
    return sorted(p.resolve() for p in path.iterdir() if p.is_file())


def has_weights(path: Path) -> bool:
    """Whether the save_pretrained folder `path` holds weights (*.safetensors)."""
    return any(path.glob("*.safetensors"))


def teacher_config(path: Path, needs_weights: bool):
    """The config of the save_pretrained folder `path`; ValueError naming the folder where it
    is no folder, holds no config.json transformers reads, is of a model type surgery does not
    support, or holds no weights where `needs_weights`."""
    try:
        from transformers import AutoConfig
    except ImportError as err:
        raise ImportError(
            f"model.teacher needs transformers and peft: pip install 'attn_zoo[hf]' ({err})"
        ) from err

    where = f"model.teacher: {path}"
    if not (path / "config.json").is_file():
        what = "holds no config.json" if path.is_dir() else "is no folder"
        raise ValueError(
            f"{where} {what}: a teacher is a folder written by save_pretrained (a config.json "
            "and *.safetensors weights), relative to the grid file's folder"
        )
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{where}: its config.json cannot be read: {err}") from None
    if config.model_type not in SUPPORTED:
        raise ValueError(
            f"{where} is a {config.model_type!r} model: valid teachers are "
            f"{', '.join(SUPPORTED)} (attention surgery's models)"
        )
    if needs_weights and not has_weights(path):
        raise ValueError(
            f"{where} holds no *.safetensors weights, which its model and attention transfer "
            "need (save the teacher with save_pretrained; model.from_scratch = true with "
            "transfer_steps 0 trains its architecture from fresh weights)"
        )
    return config


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off inside the block, as they were after it."""
    from transformers.utils import logging

    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()


def load_teacher(path: Path) -> nn.Module:
    """The causal LM saved in `path` (swapped already where its config records a swap), in
    float32, training mode. ValueError naming the folder and the weights where its weights
    lack some of its model's or hold others (transformers would fill the missing ones with
    fresh random values, each load with its own: load_swapped refuses them likewise)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if getattr(AutoConfig.from_pretrained(path), RECORD, None):
        return load_swapped(path).float().train()
    with no_progress_bars():  # a grid loads it in every cell: its bar would flood the log
        hf, loaded = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, output_loading_info=True
        )
    missing, unexpected = sorted(loaded["missing_keys"]), sorted(loaded["unexpected_keys"])
    if missing or unexpected:
        raise ValueError(
            f"model.teacher: {path}: its weights do not fit the model of its config.json "
            f"({len(missing)} missing: {some_keys(missing) or 'none'}; {len(unexpected)} not "
            f"the model's: {some_keys(unexpected) or 'none'}): valid is a folder whose "
            "*.safetensors hold every weight of its model and no other (save_pretrained)"
        )
    return hf.train()


def _check_cell(size: dict, config, task, mechanism: str, kwargs: dict, steps: int) -> None:
    """ValueError naming the first setting of a teacher's cell that cannot apply."""
    filled = mechanism_settings(mechanism, config, 0, {})
    for key, name in HEADS.items():
        if key in kwargs and key in filled and kwargs[key] != filled[key]:
            raise ValueError(
                f"mechanism kwarg {key} = {kwargs[key]!r}: a swapped {mechanism} layer of this "
                f"teacher has {filled[key]} (its {name} is {getattr(config, name)}), which its "
                "projections and rotary tables fit (attn_zoo/interop/surgery.py: "
                "mechanism_settings)"
            )
    others = sorted(set(size) - set(TEACHER_OPTIONS) - set(SIZE_KEYS))
    if others:
        raise ValueError(
            f"model options {others} do not apply to a teacher's model (its config.json sets "
            f"its architecture); valid with model.teacher: {', '.join(TEACHER_OPTIONS)}"
        )
    for key, name in (("d_model", "hidden_size"), ("n_layers", "num_hidden_layers")):
        if size[key] != getattr(config, name):
            raise ValueError(
                f"size {size['label']!r} has {key} = {size[key]}, the teacher's {name} is "
                f"{getattr(config, name)}: a teacher's cell needs its size"
            )
    if task.kind != "language_model" or task.vocab_size != config.vocab_size:
        raise ValueError(
            f"a teacher's cell trains a language model of its vocabulary ({config.vocab_size} "
            f"tokens): the task is a {task.kind} task of {task.vocab_size} tokens"
        )
    transfer, finetune = size.get("transfer_steps", 0), size.get("finetune", "all")
    if transfer > steps or (transfer == steps and finetune != "none"):
        raise ValueError(
            f"model.transfer_steps = {transfer} leaves no step of training.steps = {steps} to "
            f"model.finetune = {finetune!r}: valid is fewer transfer steps (or finetune 'none' "
            "with transfer_steps = steps)"
        )
    if "lora_rank" in size and finetune != "lora":
        raise ValueError(
            f"model.lora_rank = {size['lora_rank']} sets the rank of finetune 'lora' adapters, "
            f"and model.finetune = {finetune!r}: set finetune = 'lora' or leave lora_rank out"
        )
    if not swaps(mechanism, kwargs) and (transfer or finetune not in ("none", "all")):
        raise ValueError(
            f"mechanism {NO_SWAP!r} with no kwargs but the teacher's heads keeps the teacher's "
            f"attention (no swap), so there is no swapped layer for model.transfer_steps = "
            f"{transfer} and model.finetune = {finetune!r} to train; valid for it: "
            "transfer_steps 0, finetune 'none' or 'all'"
        )


def build_teacher_model(
    size: dict, folder: str, task, mechanism: str, kwargs: dict, steps: int
) -> CausalLM:
    """The model of a cell with a teacher (module docstring): its size, grid `folder`, task,
    mechanism and its `kwargs`, and training steps; its `stages` set and the first stage's
    parameters the trainable ones. Draws fresh weights from torch's generator (seed it first)
    with `from_scratch`. ValueError naming what cannot apply, before anything is loaded where
    it can be."""
    path = teacher_folder(size, folder)
    transfer, finetune = size.get("transfer_steps", 0), size.get("finetune", "all")
    from_scratch = size.get("from_scratch", False)
    config = teacher_config(path, needs_weights=transfer > 0 or not from_scratch)
    _check_cell(size, config, task, mechanism, kwargs, steps)
    if from_scratch:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        hf = load_teacher(path)
    swapped = swaps(mechanism, kwargs)
    if swapped:
        swap_attention(hf, mechanism, **kwargs)
    model, trains = CausalLM(hf.train()), {}
    if finetune != "none":  # first: a "lora" stage adds the adapters the transfer then freezes
        if swapped:
            rank = size.get("lora_rank", 8)
            set_trainable(hf, finetune, lora_rank=rank)
            if finetune == "lora":
                check_lora_rank(hf, rank)
        trains[finetune] = trained_names(model)
    if transfer:
        set_trainable(hf, "transfer")
        trains["transfer"] = trained_names(model)
    model.stages = tuple(Stage(name, last, trains[name]) for name, last in stage_steps(size, steps))
    if model.stages:
        train_only(model, model.stages[0])
    return model


def check_lora_rank(hf: nn.Module, rank: int) -> None:
    """ValueError unless `rank` is at most min(d_in, d_out) of each projection adapted in `hf`
    (peft's LoRA layers): an adapter B A, A (rank, d_in), B (d_out, rank), has rank at most
    min(rank, d_in, d_out), so a larger rank adds parameters and no rank."""
    narrowest = min(min(layer.in_features, layer.out_features) for layer in adapter_layers(hf))
    if rank > narrowest:
        raise ValueError(
            f"model.lora_rank = {rank} is above min(d_in, d_out) = {narrowest} of the "
            "narrowest projection finetune 'lora' adapts (a larger rank adds parameters, no "
            f"rank): valid is 1 to {narrowest}"
        )


def frozen_teacher(size: dict, folder: str) -> nn.Module | None:
    """The teacher of a cell's size (`teacher_folder`) as saved, frozen, in eval mode: what
    attention transfer matches and `recovered` compares with; None without a teacher, or
    where its folder holds no weights (a from_scratch cell's architecture only)."""
    path = teacher_folder(size, folder) if has_teacher(size) else None
    if path is None or not has_weights(path):
        return None
    return load_teacher(path).requires_grad_(False).eval()


def train_only(model: nn.Module, stage: Stage) -> None:
    """Make `stage`'s parameters the only trainable ones of `model`."""
    for name, param in model.named_parameters():
        param.requires_grad_(name in stage.trains)


MIN_GAIN = 0.01  # a teacher's least gain over uniform guessing, a share of log V, for `recovered`


def recovered(loss: float, teacher_loss: float, vocab_size: int) -> float | None:
    """The fraction of the teacher's quality a model recovers: (log V - loss) / (log V -
    teacher_loss), both mean losses (nats per token) on one split, V the vocabulary size: the
    share of the teacher's gain over guessing uniformly (log V nats) that the model keeps; 1:
    the teacher's loss, 0: uniform guessing, below 0: worse. None where the teacher's gain is
    below `MIN_GAIN` of log V (no better than uniform guessing, or barely: the fraction would
    mean nothing, each nat of the model's loss moving it by 1 / gain: +-100 at a gain of
    1e-4 nats)."""
    uniform = math.log(vocab_size)
    if not uniform - teacher_loss >= MIN_GAIN * uniform:
        return None
    return (uniform - loss) / (uniform - teacher_loss)
