"""A spatial merge (Ymir A ‖ B) in one process: two tasks of one model
share its encoder (the model's ``base_model_prefix`` module); each keeps
its own head — a classifier (glue, vision) or its own language-model head
(sft).

Every training step takes one batch of each live task (its own global
batch size) and sums their losses, so one *iteration* advances every live
task by one of its own iterations: task k's epoch is ``step · b_k / n_k``.
Each task is evaluated at its own epoch ends and reported under its own
``job_id``; when it reaches its metric target or budget its weights (the
shared encoder and its head, a complete HF model) are written and ``done``
is reported, and the process trains the other task alone from then on.
"""

from __future__ import annotations

import math
import random
from typing import Callable, List, Sequence

from ..contract import Contract, Task
from ..hf import FmschedCallback
from .common import log


def step_budget(task: Task, n: int) -> int:
    """Steps task ``task`` may train: its max_iterations, else its epochs
    (100 when only a metric target bounds it)."""
    if task.max_iterations:
        return task.max_iterations
    epochs = task.max_epochs or 100
    return math.ceil(epochs * n / max(1, task.global_batch_size))


def joint_module(models: Sequence, live: List[bool]):
    import torch

    class Joint(torch.nn.Module):
        # HF's Trainer reads this after loading a checkpoint; the keys it
        # misses are the shared encoder's second names (stored once).
        _keys_to_ignore_on_save = None

        def __init__(self):
            super().__init__()
            self.models = torch.nn.ModuleList(models)
            first = models[0]
            prefix = first.base_model_prefix
            for m in models[1:]:
                setattr(m, prefix, getattr(first, prefix))
            self._shared = [f"models.{k}.{prefix}." for k in range(1, len(models))]
            self.last_loss = [float("nan")] * len(models)

        def forward(self, **batch):
            total, count = 0.0, 0
            for k, m in enumerate(self.models):
                # Task k's tensors arrive as "t<k>_<name>".
                prefix = f"t{k}_"
                inputs = {n[len(prefix):]: v for n, v in batch.items() if n.startswith(prefix)}
                if not inputs or not live[k]:
                    continue
                out = m(**inputs)
                self.last_loss[k] = float(out.loss.detach())
                total = total + out.loss
                count += 1
            return {"loss": total / max(1, count)}

        # The shared encoder is stored once (under the first task's model).
        # (and a tensor tied to one already kept, e.g. a language-model
        # head tied to the shared embeddings, once).
        def state_dict(self, *args, **kwargs):
            sd = super().state_dict(*args, **kwargs)
            out, seen = {}, set()
            for k, v in sd.items():
                if any(k.startswith(s) for s in self._shared):
                    continue
                ptr = (v.data_ptr(), v.shape) if hasattr(v, "data_ptr") else None
                if ptr is not None and ptr in seen:
                    continue
                if ptr is not None:
                    seen.add(ptr)
                out[k] = v
            return out

    return Joint()


def joint_batches(rows: Sequence[Sequence[dict]], sizes: Sequence[int], live: List[bool], seed: int):
    """An endless stream (a torch ``IterableDataset``) of joint batches:
    one batch of every live task, each task's examples in a shuffled order
    per pass."""
    import torch

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            rng = random.Random(seed)
            orders = [list(range(len(r))) for r in rows]
            cursor = [len(o) for o in orders]
            while True:
                joint = {}
                for k, r in enumerate(rows):
                    if not live[k]:
                        continue
                    batch = []
                    for _ in range(sizes[k]):
                        if cursor[k] >= len(orders[k]):
                            rng.shuffle(orders[k])
                            cursor[k] = 0
                        batch.append(r[orders[k][cursor[k]]])
                        cursor[k] += 1
                    joint[k] = batch
                yield joint

    return Stream()


class SpatialCallback(FmschedCallback):
    """The contract for two trained tasks: progress, evaluations and
    ``done`` per job, each task's weights written when it is done."""

    def __init__(self, contract: Contract, models, joint, live: List[bool], sizes: Sequence[int],
                 evaluate: Callable[[int], float], save: Callable[[object, str], None], **kw):
        super().__init__(contract, **kw)
        self.models, self.joint, self.live, self.sizes = models, joint, live, sizes
        self.evaluate, self.save = evaluate, save
        # The metric ``evaluate`` computes, for tasks whose target names none.
        self.metric = "accuracy"
        self.n = [t.samples_per_epoch for t in contract.tasks]
        self.budget = [step_budget(t, n) for t, n in zip(contract.tasks, self.n)]

    def epoch_of(self, k: int, step: int) -> float:
        return step * self.sizes[k] / self.n[k]

    def finish(self, k: int, why: str) -> None:
        task = self.contract.tasks[k]
        out = self.contract.output_path(task.job_id)
        self.save(self.models[k], out)
        self.live[k] = False
        log(f"task {task.task} ({task.job_id}) done: {why}; weights in {out}")
        self.reporter.done(task.job_id, out)

    def on_step_end(self, args, state, control, **kwargs):
        control = super().on_step_end(args, state, control, **kwargs)
        step = state.global_step
        for k, task in enumerate(self.contract.tasks):
            if not self.live[k] or self.contract.profile:
                continue
            if math.floor(self.epoch_of(k, step)) > math.floor(self.epoch_of(k, step - 1)):
                value = self.evaluate(k)
                self.reporter.eval(task.job_id, step, self.epoch_of(k, step), task.metric or self.metric, value)
                if task.metric and task.metric_reached(value):
                    self.finish(k, f"{task.metric} {value:.4f} reached its target")
                    continue
            if step >= self.budget[k]:
                self.finish(k, f"its budget of {self.budget[k]} iterations")
        if not any(self.live):
            control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            for k, task in enumerate(self.contract.tasks):
                if self.live[k]:
                    loss = self.joint.last_loss[k]
                    self.reporter.progress(task.job_id, state.global_step, state.global_step * self.sizes[k],
                                           loss if math.isfinite(loss) else float(logs["loss"]), self._step_time)
        return control

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        return control

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if not self.contract.profile and not self.signals.terminate.is_set():
            for k in range(len(self.contract.tasks)):
                if self.live[k]:
                    self.finish(k, "training ended")
        return control


def train_spatial(contract: Contract, args, models, rows_train, evaluate, collate_task, save, signals, reporter,
                  metric: str = "accuracy"):
    """Trains ``models`` (one per task, built from the same weights) as a
    spatial merge. ``collate_task(rows)`` turns one task's examples into
    the keyword tensors its model takes (with ``labels``)."""
    import torch
    from transformers import Trainer, TrainingArguments

    from ..hf import training_arguments

    tasks = contract.tasks
    for t, rows in zip(tasks, rows_train):
        if not t.samples_per_epoch:
            t.samples_per_epoch = len(rows)
    live = [True, True]
    joint = joint_module(models, live)
    sizes = [max(1, t.global_batch_size) for t in tasks]
    kw = training_arguments(tasks[0])
    if not torch.cuda.is_available():
        kw.pop("fp16", None)
        kw.pop("bf16", None)

    def collate(features):
        out = {}
        for k, rows in features[0].items():
            for name, v in collate_task(rows).items():
                out[f"t{k}_{name}"] = v
        return out

    callback = SpatialCallback(contract, models, joint, live, sizes, evaluate, save, signals=signals,
                               reporter=reporter)
    callback.metric = metric
    targs = TrainingArguments(
        output_dir=contract.checkpoint_dir, per_device_train_batch_size=1, max_steps=max(callback.budget),
        eval_strategy="no", save_strategy="no", save_total_limit=2, logging_strategy="steps",
        logging_steps=max(1, args.logging_steps), report_to=[], use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0, disable_tqdm=True, seed=args.seed, ignore_data_skip=True,
        remove_unused_columns=False, **kw)
    trainer = Trainer(model=joint, args=targs, train_dataset=joint_batches(rows_train, sizes, live, args.seed),
                      data_collator=collate, callbacks=[callback])
    log(f"spatial merge: {tasks[0].task} ‖ {tasks[1].task}, batches {sizes[0]} + {sizes[1]}, "
        f"budgets {callback.budget} iterations")
    trainer.train(resume_from_checkpoint=contract.resume_from)
    callback.reporter.close()
    return 0

