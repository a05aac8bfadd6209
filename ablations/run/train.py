"""Training one cell of a grid: build the task's data and the model, train, evaluate.

AdamW (its betas: `training.betas`) with linear warmup then cosine decay (or constant),
gradient-norm clipping (none where `grad_clip` is 0), label smoothing of the training loss
(`label_smoothing`, default none; the curve's train loss is the smoothed one, evaluation
losses are plain cross-entropy), evaluation on the validation split every
`eval_every` steps (and at the end), early stop once the validation metric reaches
`early_stop_target`, or once it has not improved on its best for `patience` evaluations (the
cell keeps its last weights), or as `pruned` where a search's pruner says so at an evaluation
(`should_prune`, ablations.run.search: its metrics and curve so far, and `pruned_at`); a
teacher's cell stops early or is pruned in its last stage only (below). The metric
is accuracy: per example for classification (sequences or images), per scored position for
language-model and seq2seq tasks, which also get `exact` (the share of examples with every
scored position right). A finished cell is tested on every test split of its task ("test",
and any "test_<what>": metrics "test_acc", "test_<what>_acc", and so on). A NaN or inf loss
ends the cell as `diverged` at its step; so do weights, validation or test metrics that are
not finite at the end (a last update that made the weights NaN): a result is done only if it
is finite. The same seed gives the same metrics on CPU.

Where and how (ablations/grid/devices.py says what is valid, ablations/run/devices.py what it
resolves to): the model is built on the CPU (the same initial weights everywhere) and moved
with the data to the cell's device, "auto" resolved in the worker (an executor may place it,
e.g. on its own GPU); with `precision = "bf16"` the forward passes (training and evaluation) run
under bfloat16 autocast, weights and optimizer in float32; with `compile = true` they run
through `torch.compile(model)`, and an error compiling it fails the cell (no fallback to
eager). The environment record says the device and compute dtype the cell trained on, and the
SHA-256 of each data file its task read ("data", ablations.run.provenance). Weights and maps
come back on the CPU.

With `keep_maps`, a finished cell also returns the attention maps of its trained model on one
fixed test example (`MAPS_EXAMPLE`, see `attention_record`), so that a report draws them without
running a model (ablations.report.attention_maps).

A cell whose size names a teacher (ablations.grid.teacher: a Hugging Face causal LM, swapped to
the cell's mechanism) trains in stages: steps 1 to `transfer_steps` on attention transfer
(attn_zoo.interop.distill.transfer_loss against the frozen teacher: the curve's train loss
there is that mean squared error, its validation loss and metric the model's next-token ones),
then up to `steps` on next-token loss, each stage with fresh AdamW moments and its own warmup
and decay (`stage_lr_factor`); with finetune "none" it ends after the transfer (`steps` is
then the transfer's; none at all: the swapped model is only evaluated, its curve empty). Early
stop, patience and the pruner judge the evaluations of its last stage only, which trains the
model the cell reports: the transfer's are in its curve, yet stop nothing, and patience counts
from the last stage's first evaluation. Such a cell also records `teacher_test_loss` and
`test_recovered` (ablations.grid.teacher.recovered).

A cell can be interrupted and resumed (ablations.run.resume): given a resume checkpoint it trains on
from that step and ends with exactly the metrics and curve of an uninterrupted run (its
`wall_s` counts the seconds of every part); it hands out checkpoints as its `ResumePlan` says.
"""

from __future__ import annotations

import contextlib
import math
import platform
import time
import traceback
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ablations.grid.cell import Cell
from ablations.grid.cell_model import build_cell_model, forward
from ablations.grid.schema import TrainingSettings
from ablations.grid.teacher import (
    CausalLM,
    Stage,
    frozen_teacher,
    recovered,
    stages_of,
    train_only,
)
from ablations.run.devices import compute_dtype, resolve_device
from ablations.run.provenance import data_record, source_state
from ablations.run.resume import LoopState, ResumeError, ResumePlan, load_state, save_state
from ablations.run.torch_state import changes, reset_torch_state, torch_state
from ablations.tasks import IGNORE_INDEX
from attn_zoo.interop.distill import transfer_loss
from attn_zoo.kernels.dispatch import plugin_backends_first
from attn_zoo.maps import recording_attention
from attn_zoo.registry import replaced_names


@dataclass
class CellResult:
    """What `train_cell` returns, in the process that trained the cell."""

    status: str  # done | diverged | pruned
    metrics: dict
    curve: list = field(default_factory=list)  # [step, train_loss, val_loss, val_metric]
    environment: dict = field(default_factory=dict)
    state: dict | None = None  # the trained model's state_dict, when asked for
    maps: dict | None = None  # attention_record of the trained model, when asked for (done only)
    notes: list[str] = field(default_factory=list)  # one-line messages for the driver to print


LOST = "lost"  # no result of the cell's (Ray lost the task, a worker was killed): not recorded


@dataclass
class CellOutcome:
    """What a worker sends the driver for one cell (ablations.run.cell_worker.run_cell): the record
    of its outcome (`record()`: the keyword arguments of `ResultsStore.finish`) and, in a grid
    that keeps checkpoints, the files the driver writes beside the store: the trained weights
    (`state`) and attention maps (`maps`), as torch.save bytes, and why the maps could not be
    recorded (`maps_error`). Status `LOST`: the infrastructure lost the cell; the driver
    releases it and the next run trains it again."""

    status: str  # done | diverged | pruned | failed | LOST
    environment: dict = field(default_factory=dict)
    metrics: dict | None = None
    curve: list | None = None
    error: str | None = None  # the traceback of a failed cell, the reason a cell was lost
    state: bytes | None = None
    maps: bytes | None = None
    maps_error: str | None = None
    notes: list[str] = field(default_factory=list)  # CellResult.notes

    def record(self) -> dict:
        """The keyword arguments of `ResultsStore.finish` (status, metrics, curve, environment,
        error)."""
        return dict(
            status=self.status,
            metrics=self.metrics,
            curve=self.curve,
            environment=self.environment,
            error=self.error,
        )


def environment(device: str | None = None, dtype: str | None = None) -> dict:
    """Versions, machine and threads of this process, and, when known, the device a cell
    trained on ("cpu", "cuda:0", ...; with "device_name" for a GPU) and its compute dtype
    ("float32", or "bfloat16" under autocast); "replaced": the registry entries a plugin
    replaced in this process (attn_zoo.registry.replaced_names: "mechanism standard"), where
    any was: a name in the config then means another entry than the built-in one;
    "outranking": the plugins' kernel backends that outrank a built-in one, which ``auto`` may
    pick for built-in mechanisms (attn_zoo.kernels.dispatch.plugin_backends_first: "softmax
    backend fast"), where any does."""
    import attn_zoo

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "attn_zoo": attn_zoo.__version__,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
    }
    if device is not None:
        env["device"] = str(device)
        with contextlib.suppress(Exception):  # a device that could not be used: no name
            if torch.device(device).type == "cuda":
                env["device_name"] = torch.cuda.get_device_name(torch.device(device))
    if dtype is not None:
        env["dtype"] = dtype
    replaced = replaced_names()
    if replaced:
        env["replaced"] = [f"{registry} {name}" for registry, name in replaced]
    outranking = plugin_backends_first()
    if outranking:
        env["outranking"] = outranking
    return env


def _autocast(device: torch.device, dtype: torch.dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def _to_cpu(obj, float32: bool = False):
    """Tensors of `obj` (nested dicts and lists) on the CPU; with `float32`, bfloat16 and
    float16 ones (maps recorded under autocast) as float32."""
    if isinstance(obj, Tensor):
        obj = obj.detach().cpu()
        return obj.float() if float32 and obj.dtype in (torch.bfloat16, torch.float16) else obj
    if isinstance(obj, dict):
        return {k: _to_cpu(v, float32) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v, float32) for v in obj]
    return obj


def smoke_test(cell: Cell) -> None:
    """Build the cell's task and model and run one forward and backward pass on two fresh
    examples: a mechanism, size or task setting that cannot train fails here, in seconds."""
    torch.manual_seed(cell.seed)
    task = cell.build_task()
    x, y = task.generate(2, torch.Generator().manual_seed(cell.seed))
    _, loss, _ = forward(build_cell_model(cell, task), task, x, y)
    loss.backward()


def lr_factor(step: int, training: TrainingSettings) -> float:
    """Linear warmup to 1, then cosine decay to 0 (or constant)."""
    warmup = training.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    if training.schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, training.steps - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def stage_lr_factor(step: int, training: TrainingSettings, stages: tuple[Stage, ...]) -> float:
    """`lr_factor` within the stage of step ``step + 1`` (`step` steps done): each stage warms
    up and decays over its own steps (one stage: `lr_factor` itself)."""
    first = 0
    for stage in stages:
        if step < stage.last_step:
            length = {"steps": stage.last_step - first}
            return lr_factor(step - first, training.model_copy(update=length))
        first = stage.last_step
    return lr_factor(step, training)


def smoothed_loss(logits: Tensor, targets: Tensor, smoothing: float) -> Tensor:
    """Cross-entropy with label smoothing `smoothing` over the scored targets: logits
    ``(..., classes)``, targets ``(...)`` with `IGNORE_INDEX` where not scored."""
    return F.cross_entropy(
        logits.flatten(0, -2).float(), targets.flatten(), ignore_index=IGNORE_INDEX,
        label_smoothing=smoothing,
    )  # fmt: skip


@torch.no_grad()
def evaluate(model: nn.Module, task, split, batch_size: int = 512) -> dict[str, float]:
    """Over a split: mean loss per scored target (nats), accuracy, and for sequence targets
    `exact` (the share of examples with every scored position right) and `bits` (the loss in
    bits per scored token: per character for a character-level task)."""
    model.eval()
    loss_sum, correct, count, exact = 0.0, 0, 0, 0
    for i in range(0, len(split.inputs), batch_size):
        logits, loss, y = forward(
            model, task, split.inputs[i : i + batch_size], split.targets[i : i + batch_size]
        )
        scored = y != IGNORE_INDEX
        right = (logits.argmax(-1) == y) | ~scored
        n = int(scored.sum())
        loss_sum += float(loss) * n
        correct += int(right[scored].sum())
        count += n
        exact += int(right.flatten(1).all(1).sum()) if y.dim() > 1 else 0
    model.train()
    metrics = {"loss": loss_sum / max(count, 1), "acc": correct / max(count, 1)}
    if split.targets.dim() > 1:
        metrics["exact"] = exact / len(split.targets)
        metrics["bits"] = metrics["loss"] / math.log(2)  # bits per scored token
    return metrics


MAPS_EXAMPLE = 0  # the test example (of the cell's seed) whose attention maps a cell keeps


def has_attention_maps(model: nn.Module) -> bool:
    """Whether any module of `model` records attention maps (linear and additive attention
    have none)."""
    return any(callable(getattr(module, "attention_maps", None)) for module in model.modules())


def attention_record(model: nn.Module, task, test, example: int = MAPS_EXAMPLE) -> dict:
    """The attention maps of `model` on example `example` of the `test` split, recorded from
    the forward pass training uses: {"example": int, "labels": the input tokens as strings (None
    for non-token inputs), "target": the example's target as a list, "maps": module name ->
    kind -> tensor (1, heads or relations, N, M), {} for a model without attention maps}."""
    x, y = test.inputs[example : example + 1], test.targets[example : example + 1]
    maps: dict = {}
    if has_attention_maps(model):
        with recording_attention(model) as recorded:
            forward(model, task, x, y)
        maps = dict(recorded)
    labels = [str(int(t)) for t in x[0]] if x.dtype == torch.long else None
    return {"example": example, "labels": labels, "target": y[0].tolist(), "maps": maps}


def stops_early(loop: LoopState, training: TrainingSettings) -> bool:
    """Whether training stops after the evaluation just recorded in `loop` (its val_metric):
    it reaches `training.early_stop_target` (0: never), or it is no better than `loop.best`
    for the `training.patience`-th evaluation in a row (0: never); `loop.best` and
    `loop.stale` (those evaluations) updated."""
    target = training.early_stop_target
    if target and loop.val_metric >= target:
        return True
    if loop.val_metric > loop.best:
        loop.best, loop.stale = loop.val_metric, 0
    else:
        loop.stale += 1
    return bool(training.patience) and loop.stale >= training.patience


def check_torch_state(what: str) -> None:
    """RuntimeError where `what` changed torch's global state from its defaults (the cell would
    have trained, or would train, under another state than its config and store say)."""
    changed = changes(torch_state(), put_back=False)
    if changed:
        raise RuntimeError(
            f"{what} changed torch's global state ({', '.join(changed)}): a mechanism or task "
            "must not change process-wide settings such as the default dtype "
            "(ablations/run/torch_state.py); set them per tensor, or in the grid"
        )


def train_cell(
    cell: Cell,
    on_progress=None,
    keep_state: bool = False,
    keep_maps: bool = False,
    device: str | None = None,
    resume: ResumePlan | None = None,
    on_checkpoint=None,
    should_prune=None,
) -> CellResult:
    """Train and evaluate `cell`; `on_progress(step, loss)` is called at each evaluation;
    `should_prune(step, val_loss, val_metric)` at each evaluation of its last stage (a
    teacher's cell: not of its transfer) after which the cell would train on (not its last, nor
    one that stops it early): true ends it there as `pruned`;
    `keep_state` returns the trained weights too, `keep_maps` the `attention_record` of the
    trained model (a cell that finished, not a diverged one; should recording fail, a record
    without maps whose "error" is the traceback). `device`: where to train (an executor's
    placement), default the cell's `training.device` resolved here (`resolve_device`).
    `resume` (ablations.run.resume): the checkpoint to start from, if any (one that is not trusted
    is ignored, with a note: the cell trains from step 0), and when `on_checkpoint(step, data)`
    is handed a new one (never after the last step); a checkpoint must match the code and
    plugins of the plan's `sources` (the driver's; without them, this checkout's code and no
    plugins), the data files' digests and torch's global state (ablations/run/torch_state.py:
    put back to torch's defaults first, with a note). Exceptions propagate (the runner records
    them as failed cells with the traceback), a compile error included."""
    t = cell.training
    device = torch.device(resolve_device(t.device) if device is None else device)
    dtype = compute_dtype(t.precision, str(device))
    notes = [f"torch's global state put back to its defaults: {', '.join(changed)}"
             for changed in [reset_torch_state()] if changed]  # fmt: skip
    torch.manual_seed(cell.seed)
    task = cell.build_task()
    data = data_record(cell, task)  # the files as the task (and the cell's teacher) read them
    made = task.splits(cell.seed)
    splits = {
        name: type(split)(split.inputs.to(device), split.targets.to(device))
        for name, split in made.items()
    }
    model = build_cell_model(cell, task).to(device)  # built on the CPU: the same weights anywhere
    teacher = frozen_teacher(cell.size, cell.folder)  # a teacher's cells: ablations.grid.teacher
    teacher = teacher if teacher is None else teacher.to(device)
    check_torch_state("building the cell's model")
    resume = resume or ResumePlan()
    sources = resume.sources or {"code": source_state(), "plugins": {}}
    inputs = {"data": data, "torch": torch_state(), **sources}  # what a checkpoint must match
    run = torch.compile(model) if t.compile else model
    opt = torch.optim.AdamW(
        model.parameters(), lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay
    )
    stages = stages_of(model, t.steps)
    end = stages[-1].last_step if stages else 0  # the last step (before: t.steps or fewer)
    restarts = {stage.last_step + 1 for stage in stages[:-1]}  # first steps of a later stage
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: stage_lr_factor(s, t, stages))
    gen = torch.Generator().manual_seed(cell.seed)
    loop = LoopState()
    if resume.data is not None:
        try:
            loop = load_state(resume.data, cell, model, opt, schedule, gen, device, inputs)
            notes.append(f"resumed from its checkpoint at step {loop.step}")
        except ResumeError as err:
            notes.append(f"resume checkpoint ignored ({err}); trained from step 0")
    resumed_from, before = loop.step, loop.wall_s
    train = splits["train"]
    start = saved = time.perf_counter()
    status, step, stage = "done", loop.step, None
    for step in range(loop.step + 1, end + 1):
        if stage is None or step > stage.last_step:
            stage = next(s for s in stages if step <= s.last_step)
            train_only(model, stage)
        if step in restarts:  # a new stage: fresh AdamW moments (its schedule restarts too)
            opt.state.clear()
        batch = torch.randint(len(train.inputs), (t.batch_size,), generator=gen).to(device)
        with _autocast(device, dtype):
            if stage.name == "transfer":
                loss = transfer_loss(teacher, model.hf, train.inputs[batch])
            else:
                logits, loss, y = forward(run, task, train.inputs[batch], train.targets[batch])
                if t.label_smoothing:
                    loss = smoothed_loss(logits, y, t.label_smoothing)
        if not torch.isfinite(loss):
            status = "diverged"
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if t.grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        schedule.step()
        if step % t.eval_every == 0 or step == end:
            with _autocast(device, dtype):
                val = evaluate(run, task, splits["validation"])
            loop.val_loss, loop.val_metric = val["loss"], val["acc"]
            loop.curve.append([step, loss.item(), loop.val_loss, loop.val_metric])
            if on_progress is not None:
                on_progress(step, loss.item())
            reported = stage.last_step == end  # the last stage trains the model reported
            if reported and stops_early(loop, t):
                break
            if (
                reported
                and should_prune is not None
                and step < end
                and should_prune(step, loop.val_loss, loop.val_metric)
            ):
                status = "pruned"
                break
        now = time.perf_counter()
        if on_checkpoint is not None and step < end and resume.due(step, now - saved):
            loop.step, loop.wall_s = step, before + now - start
            on_checkpoint(step, save_state(cell, loop, model, opt, schedule, gen, device, inputs))
            saved = time.perf_counter()
    if end == 0:  # a teacher's model that trains no step (the swap alone): validated as it is
        with _autocast(device, dtype):
            val = evaluate(run, task, splits["validation"])
        loop.val_loss, loop.val_metric = val["loss"], val["acc"]
    if status == "done" and not all(torch.isfinite(p).all() for p in model.parameters()):
        status = "diverged"  # the last update made the weights non-finite
    wall = before + time.perf_counter() - start
    val_loss, val_metric = loop.val_loss, loop.val_metric
    metrics = {
        "steps": step,
        "params": sum(p.numel() for p in model.parameters()),
        "wall_s": wall,
        "step_ms": 1e3 * wall / max(step, 1),
        "val_loss": val_loss,
        "val_acc": val_metric,
    }
    if status == "done":
        tests = {}
        for name in (name for name in splits if name.startswith("test")):
            with _autocast(device, dtype):
                test = evaluate(run, task, splits[name])
            tests.update({f"{name}_{k}": v for k, v in test.items()})
        if teacher is not None:  # the fraction of the teacher's quality recovered
            with _autocast(device, dtype):
                reference = evaluate(CausalLM(teacher), task, splits["test"])
            tests["teacher_test_loss"] = reference["loss"]
            share = recovered(tests["test_loss"], tests["teacher_test_loss"], task.vocab_size)
            if share is None:
                notes.append("test_recovered not recorded: the teacher's test loss is not 1% "
                             "below uniform guessing's (log vocab_size)")  # fmt: skip
            else:
                tests["test_recovered"] = share
        if all(math.isfinite(v) for v in (val_loss, val_metric, *tests.values())):
            metrics.update(tests)
            metrics.update(task.loss_floors(made))  # the floor under its losses, if known
        else:  # a result is done only if it is finite
            status = "diverged"
    if status in ("diverged", "pruned"):
        metrics[f"{status}_at"] = step
    check_torch_state("training or evaluating the cell")  # it ran under another state
    state = _to_cpu(model.state_dict()) if keep_state else None
    maps = None
    if keep_maps and status == "done":
        try:  # the eager model: recording hooks need no tracing
            with _autocast(device, dtype):
                maps = _to_cpu(attention_record(model, task, splits["test"]), float32=True)
        except Exception:  # a by-product: the trained cell is kept, the error with its maps
            maps = {"example": MAPS_EXAMPLE, "labels": None, "target": None, "maps": {},
                    "error": traceback.format_exc()}  # fmt: skip
    env = {**environment(str(device), str(dtype).removeprefix("torch.")), "data": data}
    if resumed_from:
        env["resumed_from_step"] = resumed_from
    return CellResult(status, metrics, loop.curve, env, state, maps, notes)
