"""HuggingFace ``Trainer`` integration: a callback that follows the trainer
contract.

    from fmsched_trainer import Contract
    from fmsched_trainer.hf import FmschedCallback
    contract = Contract()
    callback = FmschedCallback(contract)
    train_set, eval_set = load_and_tokenise(...)   # no GPU needed
    callback.standby()   # pipeline switch: wait here, data ready, if asked
    trainer = Trainer(model, ..., callbacks=[callback])  # moves the model to the GPU
    trainer.train(resume_from_checkpoint=contract.resume_from)

:func:`training_arguments` turns the task's settings (learning rate,
optimizer, weight decay, AMP, gradient checkpointing) into
``TrainingArguments`` keywords, refusing what it cannot honour; freeze
``frozen_layers`` with :func:`fmsched_trainer.freeze_first_layers`.

It reports progress on every log step and evaluations as they happen,
stops when the target metric is reached (in its sense: a loss from above),
writes a checkpoint when the agent asks (SIGUSR2) or is about to stop the
process (SIGTERM: checkpoint, then stop training), and in profile mode
stops after ``profile_steps`` steps. :meth:`FmschedCallback.standby` is the
pre-warm of the trainer contract (Ymir §6.2): call it after everything that
needs no GPU and before ``Trainer(...)``, which puts the model on the GPU.
The Task2Vec probe is :func:`fmsched_trainer.task2vec_embedding`.
"""

from __future__ import annotations

import json
import os
import sys
import time

from .contract import Contract, process_age_s, standby
from .layers import LayerVariance, LeaseWatch, layer_index, read_control, set_frozen_layers

try:  # The callback subclasses TrainerCallback when transformers is present.
    from transformers import TrainerCallback as _Base
except Exception:  # pragma: no cover - exercised where transformers is absent
    _Base = object


# What HF's evaluate() adds to the metrics that is no quality measure.
_TIMINGS = {"runtime", "samples_per_second", "steps_per_second", "epoch", "model_preparation_time"}

# The spec's optimizer → TrainingArguments.optim.
_OPTIM = {"adamw": "adamw_torch", "sgd": "sgd", "adafactor": "adafactor"}


def training_arguments(task, bf16: bool = False, petl=("", "lora")) -> dict:
    """``TrainingArguments`` keywords for the task's settings. Raises
    ValueError naming a setting HF's Trainer cannot honour (LAMB; Adam
    with weight decay, which HF only has decoupled, as AdamW), or a PETL
    method outside ``petl`` (those the caller's model preparation applies),
    so a spec never trains differently from what the scheduler estimated.
    ``bf16`` picks bf16 over fp16 for AMP (GPUs that have it)."""
    task.check_supported(petl=petl)
    kw = {}
    if task.learning_rate > 0:
        kw["learning_rate"] = task.learning_rate
    kw["weight_decay"] = task.weight_decay
    if task.optimizer == "adam":
        if task.weight_decay > 0:
            raise ValueError("optimizer 'adam' with weight_decay > 0: HF's Trainer has only decoupled "
                             "weight decay (use adamw)")
        kw["optim"] = "adamw_torch"
    elif task.optimizer:
        kw["optim"] = _OPTIM[task.optimizer]
    if task.amp:
        kw["bf16" if bf16 else "fp16"] = True
    if task.gradient_checkpointing:
        kw["gradient_checkpointing"] = True
    if task.frozen_layers or task.max_frozen_layers:
        # Frozen parameters get no gradients; DDP must not wait for them.
        kw["ddp_find_unused_parameters"] = True
    if task.metric:
        kw["metric_for_best_model"] = task.metric
        kw["greater_is_better"] = not task.metric_lower_is_better
    return kw


def _log(message: str) -> None:
    print(f"fmsched_trainer: {message}", file=sys.stderr, flush=True)


def _device_of(args) -> str:
    """`` on cuda:0 (NVIDIA H100 80GB HBM3)``: where HF's Trainer puts the
    model; empty where the arguments do not say."""
    device = getattr(args, "device", None)
    if device is None or not hasattr(device, "type"):
        return ""
    if device.type == "cuda":
        import torch

        return f" on {device} ({torch.cuda.get_device_name(device)})"
    return f" on {device}"


def _size_mib(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total / (1 << 20)


def _prompt_features_of(out: str):
    """The activation features a tuned prompt's ``prompt.json`` in ``out``
    holds (None for other outputs)."""
    try:
        with open(os.path.join(out, "prompt.json")) as f:
            return json.load(f).get("features") or None
    except (OSError, ValueError, AttributeError):
        return None


class FmschedCallback(_Base):
    """``evaluate_watched(task, model)`` (optional) returns the accuracy of
    a watched (``eval_only``) task with the model's current weights; it is
    called at every epoch end and reported, so the scheduler's merge guard
    can judge a temporal merge A -> B while A trains. Without it watched
    tasks are not evaluated and the guard keeps the merge."""

    def __init__(self, contract: Contract, profile_steps: int = 50, evaluate_watched=None, save_output=None,
                 signals=None, reporter=None):
        self.contract = contract
        # ``save_output(model, path)`` writes the final weights where the
        # ``done`` report points (default: ``model.save_pretrained(path)``);
        # they are complete before ``done`` is sent, as a temporal merge's
        # second job starts from them.
        self.save_output = save_output
        self._last_checkpoint = time.monotonic()
        self._save_asked = None
        # Signals installed (and a reporter opened) earlier — before the data
        # loader, as a standby process must — are passed in.
        self.signals = signals or __import__("fmsched_trainer").TrainingSignals().install()
        self.reporter = reporter or contract.reporter()
        self.profile_steps = profile_steps
        self._last_step = time.monotonic()
        self._step_time = 0.0
        self._task = contract.tasks[0]
        self._job = self._task.job_id
        self._batch = contract.tasks[0].global_batch_size
        self.evaluate_watched = evaluate_watched
        # Layer freezing (ICEFROG): applied at train begin, changed by the
        # scheduler's tuner at epoch begins (layer-elastic tasks).
        self.frozen_layers = self._task.frozen_layers
        self._trainable = None
        self._variance = None
        # Leasing policies: checkpoint ahead of the lease's end.
        self._lease = LeaseWatch(contract.control_file)
        self._checkpoint_took = 0.0

    def standby(self) -> bool:
        """Waits, if the agent started this process in standby, until the
        switch starts it (see :func:`fmsched_trainer.standby`)."""
        return standby(self.contract, self.signals, self.reporter)

    # HF calls these with (args, state, control, **kwargs).
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        # After a resume HF has restored the step count: the iteration
        # counter continues from the checkpoint.
        _log(f"{self.contract.mode} from iteration {state.global_step}{_device_of(args)} "
             f"({process_age_s():.1f} s after the process started)")
        if model is not None and (self._task.frozen_layers or self._task.max_frozen_layers):
            self._trainable = {n for n, p in model.named_parameters() if p.requires_grad}
            set_frozen_layers(model, self.frozen_layers, self._trainable)
            if self._task.max_frozen_layers:
                layers = len({i for n, _ in model.named_parameters() if (i := layer_index(n)) is not None})
                self._variance = LayerVariance(layers)
        return control

    def on_epoch_begin(self, args, state, control, model=None, **kwargs):
        """A layer-elastic task takes the tuner's frozen layers here."""
        if model is None or not self._task.max_frozen_layers or self._trainable is None:
            return control
        wanted = read_control(self.contract.control_file).get("frozen_layers")
        if isinstance(wanted, int) and wanted != self.frozen_layers:
            set_frozen_layers(model, wanted, self._trainable)
            self.frozen_layers = wanted
        return control

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self._variance is not None and model is not None:
            self._variance.observe(model)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        now = time.monotonic()
        self._step_time = now - self._last_step
        self._last_step = now
        if self.signals.checkpoint.is_set() or self.signals.terminate.is_set():
            control.should_save = True
        # FMSCHED_CHECKPOINT_INTERVAL_S: at least this often.
        if not self.contract.profile and now - self._last_checkpoint >= self.contract.checkpoint_interval_s:
            control.should_save = True
        # Ahead of the lease's end by what a step and a checkpoint take
        # (twice over), at least 5 s.
        ahead = max(5.0, 2 * (self._checkpoint_took + self._step_time))
        left = None if self.contract.profile else self._lease.due(ahead)
        if left is not None:
            _log(f"checkpoint ahead of the lease ending in {left:.1f} s")
            control.should_save = True
        if control.should_save:
            self._save_asked = now
        if self.signals.terminate.is_set():
            control.should_training_stop = True
        if self.contract.profile and state.global_step >= self.profile_steps:
            control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" in logs:
            self.reporter.progress(self._job, state.global_step, state.global_step * self._batch,
                                   logs["loss"], self._step_time)
        return control

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        target = self._task.metric
        for name, value in (metrics or {}).items():
            if not (isinstance(value, (int, float)) and name.startswith("eval_")):
                continue
            metric = name[5:]
            # The validation loss is reported only when it is the target;
            # HF's timings are not metrics.
            if (metric == "loss" and target != "loss") or metric in _TIMINGS:
                continue
            self.reporter.eval(self._job, state.global_step, float(state.epoch or 0.0), metric, value)
            if metric == target and self._task.metric_reached(float(value)) and not self.contract.profile:
                control.should_training_stop = True
        return control

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        if self.signals.terminate.is_set():
            # Stopping to be suspended: the epoch did not end, HF's
            # end-of-loop evaluation would report a fractional epoch (and
            # delay the exit).
            control.should_evaluate = False
            return control
        if self._variance is not None and not self.contract.profile:
            self.reporter.layer_variance(self._job, float(state.epoch or 0.0), self.frozen_layers,
                                         self._variance.report())
        if self.evaluate_watched is not None and not self.contract.profile:
            for task in self.contract.watched:
                value = self.evaluate_watched(task, model)
                self.reporter.eval(task.job_id, state.global_step, float(state.epoch or 0.0),
                                   task.metric or "accuracy", float(value))
        return control

    def on_save(self, args, state, control, **kwargs):
        path = f"{args.output_dir}/checkpoint-{state.global_step}"
        took = time.monotonic() - (self._save_asked or time.monotonic())
        self._checkpoint_took = took
        _log(f"checkpoint {state.global_step}: {_size_mib(path):.2f} MiB written in {took:.2f} s")
        self.reporter.checkpoint(path, state.global_step)
        self.signals.checkpoint.clear()
        self._last_checkpoint = time.monotonic()
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if not self.contract.profile and not self.signals.terminate.is_set():
            out = self.contract.output_path(self._job)
            if model is not None and self.contract.is_reporter:
                if self.save_output is not None:
                    self.save_output(model, out)
                elif hasattr(model, "save_pretrained"):
                    model.save_pretrained(out)
            self.reporter.done(self._job, out, prompt_features=_prompt_features_of(out))
        return control
