"""The trainer contract: environment, signals and reports."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional


_IMPORTED = time.monotonic()


def process_age_s() -> float:
    """Seconds since this process started (Linux: from /proc, so the
    interpreter's and the imports' start-up count; elsewhere: since this
    module was imported)."""
    try:
        with open("/proc/self/stat") as f:
            # Field 22 (after the parenthesised command name): start time
            # in clock ticks after boot.
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


@dataclass
class Task:
    """One task this process trains (two for a spatial merge)."""

    job_id: str
    model: str
    task: str
    dataset_uri: str
    global_batch_size: int
    max_iterations: int = 0
    metric: Optional[str] = None
    metric_target: Optional[float] = None
    samples_per_epoch: Optional[int] = None
    max_epochs: int = 0
    # Evaluate only (never train): report an ``eval`` for this task with the
    # current weights once per epoch of the trained task. The scheduler's
    # merge guard watches B this way while A trains (temporal merge A -> B).
    eval_only: bool = False
    # How to train it (the job spec's settings). The scheduler estimates
    # with amp, gradient_checkpointing, petl and frozen_layers; a trainer
    # that cannot honour a setting must fail at start, naming it
    # (:meth:`check_supported`), never train differently from the spec.
    learning_rate: float = 0.0  # 0 = not given: the trainer's own
    optimizer: str = ""  # adamw, adam, sgd, adafactor, lamb; "" = own
    weight_decay: float = 0.0
    amp: bool = False
    gradient_checkpointing: bool = False
    petl: str = ""  # "" = full fine-tuning; lora, adapter, prefix_tuning, prompt_tuning
    frozen_layers: int = 0  # ICEFROG l: freeze the first this-many layers
    # Layer-elastic: the scheduler may change frozen_layers up to this many
    # while the job runs (read the control file each epoch; report the
    # per-layer gradient variance). 0 = not elastic.
    max_frozen_layers: int = 0
    objective: str = ""
    metric_lower_is_better: bool = False
    # A prompt-tuning job (petl "prompt_tuning"): the soft prompt's virtual
    # tokens and its starting text ("" = random). Its output is the tuned
    # prompt, not weights.
    num_virtual_tokens: int = 0
    initial_prompt: str = ""
    # A prompt-tuning job without an initial prompt, started afresh: a JSON
    # file listing the model's Prompt Bank (``id``, ``path``, ``cluster``,
    # ``medoid``); start from its best candidate
    # (:func:`fmsched_trainer.prompts.pick_from_bank`). None = no bank.
    prompt_bank: Optional[str] = None

    def metric_reached(self, value: float) -> bool:
        """Does an evaluation of the target metric reach the target (from
        above for a lower-is-better metric such as a loss)?"""
        if self.metric_target is None:
            return False
        if self.metric_lower_is_better:
            return value <= self.metric_target
        return value >= self.metric_target

    def check_supported(self, optimizers=("adamw", "adam", "sgd", "adafactor"), petl=("", "lora")) -> None:
        """Raises ValueError naming a setting this trainer cannot act on
        (by default: LAMB, and PETL methods other than LoRA)."""
        if self.optimizer and self.optimizer not in optimizers:
            raise ValueError(f"optimizer {self.optimizer!r}: this trainer supports {', '.join(optimizers)}")
        if self.petl not in petl:
            raise ValueError(f"petl {self.petl!r}: this trainer supports {', '.join(p or 'none' for p in petl)}")

    @classmethod
    def from_json(cls, d: dict) -> "Task":
        missing = [k for k in ("job_id", "model", "task", "dataset_uri", "global_batch_size") if k not in d]
        if missing:
            raise ValueError(f"FMSCHED_TASKS: a task lacks {', '.join(missing)}")
        return cls(
            job_id=d["job_id"],
            model=d["model"],
            task=d["task"],
            dataset_uri=d["dataset_uri"],
            global_batch_size=int(d["global_batch_size"]),
            max_iterations=int(d.get("max_iterations", 0) or 0),
            metric=d.get("metric"),
            metric_target=d.get("metric_target"),
            samples_per_epoch=d.get("samples_per_epoch"),
            max_epochs=int(d.get("max_epochs", 0) or 0),
            eval_only=bool(d.get("eval_only", False)),
            learning_rate=float(d.get("learning_rate", 0.0) or 0.0),
            optimizer=str(d.get("optimizer", "") or ""),
            weight_decay=float(d.get("weight_decay", 0.0) or 0.0),
            amp=bool(d.get("amp", False)),
            gradient_checkpointing=bool(d.get("gradient_checkpointing", False)),
            petl=str(d.get("petl", "") or ""),
            frozen_layers=int(d.get("frozen_layers", 0) or 0),
            max_frozen_layers=int(d.get("max_frozen_layers", 0) or 0),
            objective=str(d.get("objective", "") or ""),
            metric_lower_is_better=bool(d.get("metric_lower_is_better", False)),
            num_virtual_tokens=int(d.get("num_virtual_tokens", 0) or 0),
            initial_prompt=str(d.get("initial_prompt", "") or ""),
            prompt_bank=d.get("prompt_bank") or None,
        )


@dataclass
class TrainingSignals:
    """Flags set by the contract's signals; the training loop polls them.

    SIGUSR1 → ``start`` (a standby process may use its GPUs now; see
    :func:`standby`),
    SIGUSR2 → ``checkpoint`` (write one now, keep training),
    SIGTERM → ``terminate`` (checkpoint and exit within the grace period).
    """

    start: threading.Event = field(default_factory=threading.Event)
    checkpoint: threading.Event = field(default_factory=threading.Event)
    terminate: threading.Event = field(default_factory=threading.Event)

    # When each signal last arrived (time.monotonic()), for latency logs.
    received: Dict[str, float] = field(default_factory=dict)

    def install(self) -> "TrainingSignals":
        def on(name: str, flag: threading.Event):
            def handler(*_):
                self.received[name] = time.monotonic()
                flag.set()
            return handler

        signal.signal(signal.SIGUSR1, on("start", self.start))
        signal.signal(signal.SIGUSR2, on("checkpoint", self.checkpoint))
        signal.signal(signal.SIGTERM, on("terminate", self.terminate))
        return self


class Reporter:
    """Writes report lines to the agent's unix socket (standard output
    when there is none, so a trainer also runs by hand)."""

    def __init__(self, path: Optional[str] = None, only: Optional[set] = None):
        self._sock = None
        self._lock = threading.Lock()
        # Report types this process sends (None: all); others are dropped.
        self._only = only
        if path:
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(path)
                self._sock = s
            except OSError as e:
                print(f"fmsched_trainer: cannot connect {path}: {e}; reporting on stdout", file=sys.stderr)

    def send(self, report: dict) -> None:
        if self._only is not None and report.get("type") not in self._only:
            return
        line = (json.dumps(report, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._sock is not None:
                try:
                    self._sock.sendall(line)
                    return
                except OSError:
                    self._sock = None
            sys.stdout.write(line.decode())
            sys.stdout.flush()

    def progress(self, job_id: str, iteration: int, samples: int, loss: float, step_time_s: float) -> None:
        self.send({"type": "progress", "job_id": job_id, "iteration": int(iteration), "samples": int(samples),
                   "loss": float(loss), "step_time_s": float(step_time_s)})

    def eval(self, job_id: str, iteration: int, epoch: float, metric: str, value: float) -> None:
        self.send({"type": "eval", "job_id": job_id, "iteration": int(iteration), "epoch": float(epoch),
                   "metric": metric, "value": float(value)})

    def embedding(self, job_id: str, fisher: List[float], fisher_repeat: List[float]) -> None:
        self.send({"type": "embedding", "job_id": job_id, "fisher": [float(x) for x in fisher],
                   "fisher_repeat": [float(x) for x in fisher_repeat]})

    def layer_variance(self, job_id: str, epoch: float, frozen_layers: int, variance: List[float]) -> None:
        self.send({"type": "layer_variance", "job_id": job_id, "epoch": float(epoch),
                   "frozen_layers": int(frozen_layers), "variance": [float(v) for v in variance]})

    def checkpoint(self, path: str, iteration: int) -> None:
        self.send({"type": "checkpoint", "path": str(path), "iteration": int(iteration)})

    def prewarmed(self) -> None:
        self.send({"type": "prewarmed"})

    def warm(self) -> None:
        """A warm process finished its task and waits, its model loaded,
        for the next one (:func:`next_task`)."""
        self.send({"type": "warm"})

    def done(self, job_id: str, output: str, prompt_features: Optional[List[float]] = None) -> None:
        """The task reached its target; a prompt-tuning task adds its tuned
        prompt's activation features (the scheduler files the prompt in the
        model's Prompt Bank by them)."""
        line = {"type": "done", "job_id": job_id, "output": str(output)}
        if prompt_features:
            line["prompt_features"] = [float(x) for x in prompt_features]
        self.send(line)

    def prompt_init(self, job_id: str, source: str, score: float, scored: int, candidates: int) -> None:
        """The task started from the Prompt Bank's prompt of job ``source``
        (its score, after ``scored`` of the bank's ``candidates`` scorings)."""
        self.send({"type": "prompt_init", "job_id": job_id, "from": str(source), "score": float(score),
                   "scored": int(scored), "candidates": int(candidates)})

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


class Contract:
    """What the node agent gives this process (see the module docs)."""

    def __init__(self, env: Optional[Dict[str, str]] = None):
        env = dict(os.environ if env is None else env)
        self.env = env
        raw = env.get("FMSCHED_TASKS")
        if not raw:
            raise ValueError("FMSCHED_TASKS is not set: this process was not started by an fmsched agent")
        try:
            tasks = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"FMSCHED_TASKS is not JSON: {e}") from None
        trained = [t for t in tasks if isinstance(t, dict) and not t.get("eval_only")] if isinstance(tasks, list) else []
        if not isinstance(tasks, list) or not 1 <= len(trained) <= 2 or len(tasks) > 4:
            raise ValueError("FMSCHED_TASKS: one trained task, or two for a spatial merge (plus eval_only ones)")
        parsed = [Task.from_json(t) for t in tasks]
        # The tasks this process trains, and those it only evaluates.
        self.tasks = [t for t in parsed if not t.eval_only]
        self.watched = [t for t in parsed if t.eval_only]
        mode = env.get("FMSCHED_MODE", "train")
        if mode not in ("train", "profile"):
            raise ValueError(f"FMSCHED_MODE: {mode!r} is neither train nor profile")
        self.mode = mode
        ckpt = env.get("FMSCHED_CHECKPOINT_DIR")
        if not ckpt:
            raise ValueError("FMSCHED_CHECKPOINT_DIR is not set")
        self.checkpoint_dir = ckpt
        self.output_dir = env.get("FMSCHED_OUTPUT_DIR") or os.path.join(ckpt, "output")
        self.resume_from = env.get("FMSCHED_RESUME_FROM") or None
        self.init_weights = env.get("FMSCHED_INIT_WEIGHTS") or None
        self.report_socket = env.get("FMSCHED_REPORT_SOCKET") or None
        # The scheduler's changes while the process runs (layer tuner).
        self.control_file = env.get("FMSCHED_CONTROL_FILE") or None
        self.checkpoint_interval_s = float(env.get("FMSCHED_CHECKPOINT_INTERVAL_S", "600"))
        self.grace_s = float(env.get("FMSCHED_GRACE_S", "30"))
        # Ranks (torchrun semantics). The agent starts one process per node
        # with RANK = the global rank of the node's first GPU; a launcher
        # such as torchrun (see :meth:`torchrun_args`) gives each of its
        # workers its own RANK and LOCAL_RANK.
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.rank = int(env.get("RANK", "0"))
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.local_world_size = int(env.get("LOCAL_WORLD_SIZE", "1") or 1)
        self.nnodes = int(env.get("NNODES", "1") or 1)
        self.node_rank = int(env.get("NODE_RANK", "0") or 0)
        self.master_addr = env.get("MASTER_ADDR", "127.0.0.1")
        self.master_port = int(env.get("MASTER_PORT", "29500") or 29500)
        self.cuda_visible_devices = env.get("CUDA_VISIBLE_DEVICES", "")
        # Started ahead of a switch: see :func:`standby`.
        self.standby = env.get("FMSCHED_STANDBY") == "1"
        # May serve more tasks of its model after this one: see :func:`next_task`.
        self.warm = env.get("FMSCHED_WARM") == "1"
        self.next_task_file = env.get("FMSCHED_NEXT_TASK") or None
        # Pipeline-parallel: stage i on cuda:i (the agent orders the devices
        # for the reverse-order stage switch); 0 for data-parallel jobs.
        self.pipeline_stages = int(env.get("FMSCHED_PIPELINE_STAGES", "0") or 0)
        # Expert-parallel MoE job: GPUs per expert group (0 = none). Groups
        # are consecutive local ranks and never cross a node.
        self.expert_parallel = int(env.get("FMSCHED_EXPERT_PARALLEL", "0") or 0)

    @property
    def profile(self) -> bool:
        return self.mode == "profile"

    @property
    def is_reporter(self) -> bool:
        """Only rank 0 reports progress, evaluations and completion, and
        writes checkpoints."""
        return self.rank == 0

    @property
    def is_node_leader(self) -> bool:
        """The first worker on its node: on a node other than rank 0's it
        reports the checkpoints rank 0 wrote (its agent waits for one when
        it suspends the job) and that it is prewarmed; nothing else."""
        return self.local_rank == 0

    def reporter(self) -> Reporter:
        if self.is_reporter:
            return Reporter(self.report_socket)
        if self.is_node_leader:
            return Reporter(self.report_socket, only={"checkpoint", "prewarmed"})
        return Reporter(None, only=set())

    def torchrun_args(self) -> List[str]:
        """The ``torchrun`` flags of this node's part of the job, for a
        launch command such as ``torchrun $(...) train.py``: one worker per
        GPU of the node, the job's nodes, this node's rank among them and
        rank 0's rendezvous address (static rendezvous, as the agents start
        every node's part together)."""
        return [
            f"--nnodes={self.nnodes}",
            f"--node_rank={self.node_rank}",
            f"--nproc_per_node={self.local_world_size}",
            f"--master_addr={self.master_addr}",
            f"--master_port={self.master_port}",
        ]

    def checkpoint_path(self, iteration: int) -> str:
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        return os.path.join(self.checkpoint_dir, f"ckpt-{iteration:09d}")

    def output_path(self, job_id: str) -> str:
        path = os.path.join(self.output_dir, job_id)
        os.makedirs(path, exist_ok=True)
        return path


# The variables a warm process's next task replaces (one absent there is
# unset for that task).
NEXT_TASK_KEYS = ("FMSCHED_JOB_ID", "FMSCHED_TASKS", "FMSCHED_CHECKPOINT_DIR", "FMSCHED_OUTPUT_DIR",
                  "FMSCHED_CONTROL_FILE", "FMSCHED_RESUME_FROM", "FMSCHED_INIT_WEIGHTS")


def next_task(contract: Contract, signals: TrainingSignals, reporter: Reporter) -> Optional[Contract]:
    """PromptTuner's warm processes on the trainer's side.

    Launched with ``FMSCHED_WARM=1``, a process whose task is done may serve
    the next task of its model without loading it again. Call this after
    the task's ``done``: it reports ``warm`` and blocks, the model still
    loaded, until SIGUSR1 (returns the next task's contract, read from the
    file ``FMSCHED_NEXT_TASK`` names) or SIGTERM (returns None: exit 0).
    Without ``FMSCHED_WARM`` it returns None at once.
    """
    if not contract.warm or not contract.next_task_file:
        return None
    signals.start.clear()
    reporter.warm()
    while not signals.start.wait(0.05):
        if signals.terminate.is_set():
            return None
    signals.start.clear()
    with open(contract.next_task_file) as f:
        nxt = json.load(f)
    if not isinstance(nxt, dict):
        raise ValueError(f"FMSCHED_NEXT_TASK: {contract.next_task_file} is not a JSON object of variables")
    env = {k: v for k, v in contract.env.items() if k not in NEXT_TASK_KEYS}
    env.update({str(k): str(v) for k, v in nxt.items() if k in NEXT_TASK_KEYS and v})
    return Contract(env)


def standby(contract: Contract, signals: TrainingSignals, reporter: Reporter) -> bool:
    """The pipeline switch (Ymir §6.2) on the trainer's side.

    When the agent started this process ahead of a switch
    (``FMSCHED_STANDBY=1``) the GPUs in ``CUDA_VISIBLE_DEVICES`` still run
    another job. Call this after everything that needs no GPU is ready (data
    loader workers, tokenised data, weights in host memory) and before the
    first CUDA call: it reports ``prewarmed`` and blocks until SIGUSR1
    (returns True: train now) or SIGTERM (exits 0: the plan changed, nothing
    was trained, nothing needs saving). Without standby it returns False at
    once. ``signals`` must be installed before the data loader is built, so
    an early SIGUSR1 is not lost.
    """
    if not contract.standby:
        return False
    reporter.prewarmed()
    while not signals.start.wait(0.05):
        if signals.terminate.is_set():
            reporter.close()
            sys.exit(0)
    signals.start.clear()
    return True
