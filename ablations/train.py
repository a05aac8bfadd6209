"""Training one cell of a grid: build the task's data and the model, train, evaluate.

AdamW with linear warmup then cosine decay (or constant), gradient-norm clipping, evaluation
on the validation split every `eval_every` steps (and at the end), early stop once the
validation metric reaches `early_stop_target`. The metric is accuracy: per example for
classification, per scored position for language-model tasks. A NaN or inf loss ends the cell
as `diverged` at its step. The same seed gives the same metrics on CPU.
"""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from ablations.spec import Cell
from ablations.tasks import IGNORE_INDEX, build_task
from attn_zoo.models import LanguageModel, SequenceClassifier


@dataclass
class CellResult:
    status: str  # done | diverged
    metrics: dict
    curve: list = field(default_factory=list)  # [step, train_loss, val_loss, val_metric]
    environment: dict = field(default_factory=dict)


def environment() -> dict:
    import attn_zoo

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "attn_zoo": attn_zoo.__version__,
        "device": "cpu",
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
    }


def build_model(cell: Cell, task) -> nn.Module:
    """The model family the task's kind needs, sized by the cell, with its mechanism."""
    size = cell.size
    common = dict(
        d_model=size["d_model"],
        n_layers=size["n_layers"],
        attention=cell.mechanism_name,
        attention_kwargs=cell.mechanism_kwargs,
        dff=size.get("dff"),
        dropout=size.get("dropout", 0.0),
    )
    if task.kind == "classification":
        return SequenceClassifier(task.vocab_size, task.num_classes, max_len=task.seq_len, **common)
    if task.kind == "language_model":
        return LanguageModel(task.vocab_size, max_block_size=task.seq_len, **common)
    raise ValueError(f"task {cell.task!r} has kind {task.kind!r}: not yet trainable by the runner")


def lr_factor(step: int, training: dict) -> float:
    """Linear warmup to 1, then cosine decay to 0 (or constant)."""
    warmup = training["warmup_steps"]
    if step < warmup:
        return (step + 1) / warmup
    if training["schedule"] == "constant":
        return 1.0
    progress = (step - warmup) / max(1, training["steps"] - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def evaluate(model: nn.Module, split, batch_size: int = 512) -> tuple[float, float]:
    """(mean loss, accuracy) over a split."""
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for i in range(0, len(split.inputs), batch_size):
        x, y = split.inputs[i : i + batch_size], split.targets[i : i + batch_size]
        logits, loss = model(x, y)
        scored = y != IGNORE_INDEX
        n = int(scored.sum())
        loss_sum += float(loss) * n
        correct += int((logits.argmax(-1) == y)[scored].sum())
        count += n
    model.train()
    return loss_sum / max(count, 1), correct / max(count, 1)


def train_cell(cell: Cell, on_progress=None) -> CellResult:
    """Train and evaluate `cell`; `on_progress(step, loss)` is called at each evaluation.
    Exceptions propagate (the runner records them as failed cells with the traceback)."""
    torch.manual_seed(cell.seed)
    task = build_task(cell.task, **cell.task_kwargs)
    splits = task.splits(cell.seed)
    model = build_model(cell, task)
    t = cell.training
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], weight_decay=t["weight_decay"])
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, t))
    gen = torch.Generator().manual_seed(cell.seed)
    train = splits["train"]
    curve, start, status, step = [], time.perf_counter(), "done", 0
    val_loss = val_metric = float("nan")
    for step in range(1, t["steps"] + 1):
        batch = torch.randint(len(train.inputs), (t["batch_size"],), generator=gen)
        _, loss = model(train.inputs[batch], train.targets[batch])
        if not torch.isfinite(loss):
            status = "diverged"
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        schedule.step()
        if step % t["eval_every"] == 0 or step == t["steps"]:
            val_loss, val_metric = evaluate(model, splits["validation"])
            curve.append([step, loss.item(), val_loss, val_metric])
            if on_progress is not None:
                on_progress(step, loss.item())
            target = t["early_stop_target"]
            if target and val_metric >= target:
                break
    wall = time.perf_counter() - start
    metrics = {
        "steps": step,
        "params": sum(p.numel() for p in model.parameters()),
        "wall_s": wall,
        "step_ms": 1e3 * wall / max(step, 1),
        "val_loss": val_loss,
        "val_acc": val_metric,
    }
    if status == "done":
        metrics["test_loss"], metrics["test_acc"] = evaluate(model, splits["test"])
    else:
        metrics["diverged_at"] = step
    return CellResult(status, metrics, curve, environment())
