"""What the example trainers share: where data and weights come from, the
single-process launch, the Task2Vec probe over real gradients, and one
``train`` that drives HF's ``Trainer`` through the contract.

Data (``dataset.uri`` of the job):

- a local folder (``file:///…`` or an absolute path) holding
  ``train.jsonl`` and ``validation.jsonl`` (one JSON object per line;
  ``dev``/``test`` are accepted for the validation split), or a folder
  written by ``datasets.save_to_disk``;
- ``hf://<name>[#<config>]`` (e.g. ``hf://nyu-mll/glue#qqp``): a
  HuggingFace dataset, read through the
  ``datasets`` package and its cache (set ``HF_DATASETS_OFFLINE=1`` to stay
  offline).

Other schemes (``s3://`` …) are refused at start, naming ``dataset.uri``.

Weights: ``FMSCHED_INIT_WEIGHTS`` when the scheduler gives it (temporal
merge: the first job's output), else ``--model-path`` (a local folder),
else the job's ``model`` as a HuggingFace model id from the local cache.
``--tiny`` builds a small randomly initialised model of the job's model
family instead and tokenises bytes: no download, for tests and demos.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Dict, List, NoReturn, Optional, Sequence

from ..contract import Contract, Task
from ..fisher import task2vec_embedding
from ..layers import freeze_first_layers


def fail(message: str) -> NoReturn:
    """Exit non-zero with a message the agent keeps in the job's last log
    lines (the scheduler shows them when the job fails)."""
    print(f"fmsched_trainer: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def log(message: str) -> None:
    print(f"fmsched_trainer: {message}", file=sys.stderr, flush=True)


def arguments(description: str):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model-path", help="local folder with the pretrained weights (default: the job's model "
                   "as a HuggingFace id from the local cache)")
    p.add_argument("--tiny", action="store_true", help="a small randomly initialised model of the job's "
                   "model family and a byte tokenizer: no download (tests, demos)")
    p.add_argument("--max-length", type=int, default=128, help="tokens per example")
    p.add_argument("--profile-steps", type=int, default=20, help="training steps a profile run measures")
    p.add_argument("--probe-batches", type=int, default=4, help="batches per half of the Task2Vec probe")
    p.add_argument("--logging-steps", type=int, default=5, help="steps between progress reports")
    p.add_argument("--seed", type=int, default=17)
    return p.parse_args()


def start(description: str, petl=("", "lora")):
    """What every example does first: its arguments, the contract, the
    signal handlers (before any data is read: a pre-warmed process must not
    lose an early SIGUSR1), its reporter, the single-process launch, and
    every trained task's settings checked (a setting the trainer cannot
    honour fails the start, naming it). Returns (args, contract, signals,
    reporter)."""
    from ..contract import TrainingSignals

    args = arguments(description)
    contract = Contract()
    signals = TrainingSignals().install()
    reporter = contract.reporter()
    single_process(contract)
    try:
        for t in contract.tasks:
            t.check_supported(petl=petl)
    except ValueError as e:
        fail(str(e))
    if len(contract.tasks) == 2 and contract.pipeline_stages > 1:
        # One joint module over pipeline stages is not built here; refused
        # before anything is loaded rather than trained some other way.
        fail(f"a spatial merge of pipeline-parallel jobs ({contract.pipeline_stages} stages) is not supported by "
             "the example trainers: set `sharing: false` on such jobs (as examples/llama-sft-pipeline.yaml does)")
    return args, contract, signals, reporter


def single_process(contract: Contract) -> None:
    """The agent starts one process per node with torchrun-style ranks. A
    process that was not started by ``torchrun`` (see
    ``Contract.torchrun_args``) drives all of its node's GPUs itself (HF's
    Trainer uses DataParallel over ``CUDA_VISIBLE_DEVICES``); the rank
    variables are removed so HF does not wait for peers that will never
    come. A job over several nodes needs ``torchrun``."""
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        return
    if contract.nnodes > 1:
        fail(f"this job spans {contract.nnodes} nodes: launch it with torchrun "
             "(launch.command: [torchrun, ...flags from Contract().torchrun_args()..., -m, <module>])")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"):
        os.environ.pop(k, None)


# --- data -----------------------------------------------------------------

def local_path(uri: str) -> Optional[str]:
    if uri.startswith("file://"):
        return uri[len("file://"):]
    if uri.startswith("/"):
        return uri
    return None


def read_split(uri: str, split: str) -> List[dict]:
    """The examples of one split (``train`` or ``validation``) of the
    dataset at ``uri`` (see the module docs)."""
    path = local_path(uri)
    if path is not None:
        names = [split] + (["dev", "test", "val"] if split == "validation" else [])
        for name in names:
            for ext in ("jsonl", "json"):
                f = os.path.join(path, f"{name}.{ext}")
                if os.path.isfile(f):
                    return _read_jsonl(f)
        if os.path.isfile(os.path.join(path, "dataset_dict.json")):
            import datasets  # optional; only for folders it wrote

            d = datasets.load_from_disk(path)
            for name in names:
                if name in d:
                    return [dict(r) for r in d[name]]
        fail(f"dataset.uri {uri}: no {split}.jsonl (or a datasets.save_to_disk folder with a {split} split) "
             f"in {path}")
    if uri.startswith("hf://"):
        try:
            import datasets
        except ImportError:
            fail(f"dataset.uri {uri}: hf:// needs the 'datasets' package")
        name, _, config = uri[len("hf://"):].partition("#")
        for s in ([split] if split == "train" else ["validation", "test"]):
            try:
                return [dict(r) for r in datasets.load_dataset(name, config or None, split=s)]
            except ValueError as e:
                if "split" in str(e).lower():
                    continue  # no such split: try the next name
                fail(f"dataset.uri {uri}: {e}")
            except Exception as e:  # not found, offline without a cache, …
                fail(f"dataset.uri {uri}: {type(e).__name__}: {e}")
        fail(f"dataset.uri {uri}: no {split} split")
    fail(f"dataset.uri {uri}: this trainer reads local folders (file:// or an absolute path) and hf:// "
         "datasets; copy other data to the node first")


def _read_jsonl(path: str) -> List[dict]:
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                fail(f"{path}:{n}: not JSON: {e}")
    if not out:
        fail(f"{path}: no examples")
    return out


class ByteTokenizer:
    """Bytes as tokens (ids 3…258; 0 pad, 1 start, 2 separator): the
    ``--tiny`` models need no vocabulary file and no download."""

    pad, start, sep = 0, 1, 2
    vocab_size = 259

    def encode(self, text: str, pair: Optional[str] = None, max_length: int = 128) -> List[int]:
        ids = [self.start] + [b + 3 for b in text.encode()]
        if pair is not None:
            ids += [self.sep] + [b + 3 for b in pair.encode()]
        return (ids + [self.sep])[:max_length]


# --- models ---------------------------------------------------------------

# --tiny: the family of the job's model name and a small configuration.
_TINY = {
    "roberta": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
    "bert": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
    "vit": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=2),
    "llama": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                  intermediate_size=128),
}


def family(model: str) -> str:
    name = model.lower().rsplit("/", 1)[-1]
    for f in ("roberta", "bert", "vit", "gpt2", "llama"):
        if f in name:
            return f
    fail(f"model {model!r}: --tiny knows the families {', '.join(_TINY)}")


def tiny_config(model: str, **kw):
    from transformers import AutoConfig

    f = family(model)
    base = dict(_TINY[f])
    if f in ("roberta", "bert", "gpt2", "llama"):
        base["vocab_size"] = ByteTokenizer.vocab_size
        base["max_position_embeddings" if f != "gpt2" else "n_positions"] = 514
        base["pad_token_id"] = ByteTokenizer.pad
    if f == "roberta":
        base["bos_token_id"], base["eos_token_id"] = ByteTokenizer.start, ByteTokenizer.sep
    if f in ("gpt2", "llama"):
        base["bos_token_id"], base["eos_token_id"] = ByteTokenizer.start, ByteTokenizer.sep
    base.update(kw)
    return AutoConfig.for_model(f, **base)


def weights_source(contract: Contract, args) -> Optional[str]:
    """Where pretrained weights come from (None: a ``--tiny`` random
    initialisation)."""
    if contract.init_weights:
        return contract.init_weights
    if args.model_path:
        return args.model_path
    if args.tiny:
        return None
    return contract.tasks[0].model


def load_model(auto_class, contract: Contract, args, **kw):
    """The model to train, with the source it came from (for the log)."""
    src = weights_source(contract, args)
    if src is None:
        model = auto_class.from_config(tiny_config(contract.tasks[0].model, **kw))
        return model, f"a tiny random {family(contract.tasks[0].model)}"
    stages = contract.pipeline_stages
    if stages > 1:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() >= stages:
            # Pipeline-parallel: the layers split in order over the visible
            # GPUs, stage i on cuda:i (the agent orders the devices for the
            # reverse-order stage switch).
            kw["device_map"] = "balanced"
            log(f"pipeline: {stages} stages over cuda:0…cuda:{stages - 1}")
        else:
            log(f"pipeline of {stages} stages but {torch.cuda.device_count()} GPUs visible: one device")
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.path.isdir(src)
    try:
        model = auto_class.from_pretrained(src, local_files_only=offline, ignore_mismatched_sizes=True, **kw)
    except OSError as e:
        fail(f"cannot load weights from {src}: {e}")
    return model, src


def prepare(model, task: Task, peft_task_type: Optional[str] = None, head: Sequence[str] = (),
            prompt_ids: Sequence[int] = ()):
    """The spec's PETL method (LoRA, through the ``peft`` package: rank 8 on
    the attention projections, the task head trained in full; prompt
    tuning: a soft prompt of ``num_virtual_tokens`` started from the
    embeddings of ``prompt_ids``, the initial prompt's tokens), frozen
    layers (ICEFROG) and gradient checkpointing. Returns the model to
    train (a ``peft`` wrapper under LoRA and prompt tuning)."""
    if task.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable()
    if task.petl == "prompt_tuning":
        return prompt_model(model, task, peft_task_type, prompt_ids)
    if task.petl == "lora":
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            fail("petl 'lora' needs the 'peft' package (pip install peft)")
        cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, task_type=peft_task_type,
                         **({} if peft_task_type else {"target_modules": ["query", "value"],
                                                        "modules_to_save": list(head)}))
        model = get_peft_model(model, cfg)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        log(f"LoRA: training {trainable} of {total} parameters")
    elif task.petl:
        fail(f"petl {task.petl!r}: the example trainers support lora and full fine-tuning")
    if task.frozen_layers:
        frozen, total = freeze_first_layers(model, task.frozen_layers)
        log(f"froze the first {task.frozen_layers} layers ({frozen} of {total} parameter tensors)")
    return model


def prompt_model(model, task: Task, peft_task_type: Optional[str], prompt_ids: Sequence[int]):
    """Prompt tuning (PromptTuner): the model's weights stay frozen; only a
    soft prompt of ``task.num_virtual_tokens`` virtual tokens (20 when 0)
    is trained, prepended to every input. It starts from the embeddings of
    the initial prompt's tokens, repeated to the prompt's length (what
    peft's text initialisation does, with this trainer's tokenizer), or at
    random without one."""
    if peft_task_type != "CAUSAL_LM":
        fail("petl 'prompt_tuning': run prompt-tuning jobs with fmsched_trainer.examples.sft (a causal language "
             "model)")
    try:
        import torch
        from peft import PromptTuningConfig, get_peft_model
    except ImportError:
        fail("petl 'prompt_tuning' needs the 'peft' package (pip install peft)")
    n = task.num_virtual_tokens or 20
    embeddings = model.get_input_embeddings()
    model = get_peft_model(model, PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=n))
    if prompt_ids:
        from ..prompts import fit_rows, prompt_rows

        with torch.no_grad():
            start = embeddings(torch.tensor(list(prompt_ids), device=embeddings.weight.device))
            prompt_rows(model).copy_(fit_rows(start, n))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log(f"prompt tuning: training a prompt of {n} virtual tokens ({trainable} parameters), started from "
        + (f"{len(prompt_ids)} tokens of the initial prompt" if prompt_ids else "random embeddings"))
    return model


def save_prompt(model, task: Task, path: str) -> None:
    """A prompt-tuning job's output: the tuned prompt as a peft adapter
    (``adapter_config.json`` + ``adapter_model.safetensors``, loadable with
    ``PeftModel.from_pretrained`` on the job's model) and ``prompt.json``
    saying what it is, with the prompt's activation features (the Prompt
    Bank clusters prompts by them; :func:`fmsched_trainer.prompts.prompt_features`)."""
    from ..prompts import prompt_features

    model.save_pretrained(path)
    with open(os.path.join(path, "prompt.json"), "w") as f:
        json.dump({"job_id": task.job_id, "model": task.model, "num_virtual_tokens": task.num_virtual_tokens or 20,
                   "initial_prompt": task.initial_prompt, "features": prompt_features(model)}, f, indent=2)


def final_weights(model):
    """The model to save as the job's output: LoRA adapters merged into
    their base weights, so the output (and a temporal merge's second job
    starting from it) is a plain HF model."""
    if hasattr(model, "merge_and_unload"):
        return model.merge_and_unload()
    return model


# --- the Task2Vec probe ---------------------------------------------------

def probe_parameters(model, last_layers: int = 4):
    """The parameters the Task2Vec probe reads: the trainable weight
    matrices (LoRA's under PETL) of the last ``last_layers`` transformer
    layers. Task heads are left out (their
    shape depends on the task), so every task of one model gets an
    embedding of the same dimension."""
    from ..layers import layer_index

    named = [(n, p) for n, p in model.named_parameters()
             if p.requires_grad and p.dim() == 2 and layer_index(n) is not None]
    if not named:
        return []
    top = max(layer_index(n) for n, _ in named)
    return [(n, p) for n, p in named if layer_index(n) > top - last_layers]


def probe(model, batches: Sequence[dict], probe_batches: int, seed: int):
    """(F, F'): Task2Vec's diagonal Fisher (thesis Eq. 3.2) from real
    gradients, averaged per output unit (row) of each probed weight matrix
    as Task2Vec averages per filter, on two disjoint halves of
    ``batches``."""
    import torch

    params = probe_parameters(model)
    if not params:
        fail("the Task2Vec probe found no transformer layers in the model")
    was_training = model.training
    model.train()
    device = next(model.parameters()).device

    def gradient_of(batch):
        model.zero_grad(set_to_none=True)
        out = model(**{k: v.to(device) for k, v in batch.items()})
        out.loss.backward()
        rows = [(p.grad if p.grad is not None else torch.zeros_like(p)).float().pow(2).mean(dim=1)
                for _, p in params]
        # The squared-gradient mean per row, then a square root, so that
        # diagonal_fisher (which squares) averages the per-row Fisher.
        return torch.cat(rows).sqrt().cpu()

    fisher, repeat = task2vec_embedding(batches, gradient_of, probe_batches=probe_batches, seed=seed)
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return fisher, repeat


# --- training -------------------------------------------------------------

def devices() -> int:
    import torch

    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


def per_device_batch(task: Task) -> int:
    """The global batch split over this process's devices (HF's Trainer
    multiplies by the GPU count under DataParallel and by the world size
    under torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    split = devices() * world
    if task.global_batch_size % split:
        log(f"global batch {task.global_batch_size} is not a multiple of {split} devices: "
            f"training with {task.global_batch_size // split * split}")
    return max(1, task.global_batch_size // split)


def train(contract: Contract, args, model, train_set, eval_set, collate, compute_metrics,
          evaluate_watched=None, save_output=None, signals=None, reporter=None, preprocess_logits=None) -> int:
    """Trains the contract's task with HF's ``Trainer`` and
    :class:`~fmsched_trainer.hf.FmschedCallback` (progress, evaluations,
    checkpoints on the signals and every ``FMSCHED_CHECKPOINT_INTERVAL_S``,
    the metric target, ``done`` with the weights saved); in profile mode it
    trains ``--profile-steps`` steps and reports the Task2Vec embedding.
    Returns the exit code."""
    import torch
    from transformers import Trainer, TrainingArguments

    from ..hf import FmschedCallback, training_arguments

    task = contract.tasks[0]
    try:
        # The PETL methods `prepare` applies (each example's `start` has
        # already refused those it does not).
        kw = training_arguments(task, bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
                                petl=("", "lora", "prompt_tuning"))
    except ValueError as e:
        fail(str(e))
    if task.amp and not torch.cuda.is_available():
        # Autocast on a CPU would train bf16 where the spec was estimated
        # for a GPU; the AMP setting is a GPU one.
        log("amp: no GPU here; training in fp32")
        kw.pop("fp16", None)
        kw.pop("bf16", None)
    elif task.amp:
        log(f"amp: {'bf16' if kw.get('bf16') else 'fp16'} mixed precision")
    callback = FmschedCallback(contract, profile_steps=args.profile_steps, evaluate_watched=evaluate_watched,
                               save_output=save_output, signals=signals, reporter=reporter)
    epochs = task.max_epochs or (100 if task.metric_target is not None else 1)
    batch = per_device_batch(task)
    targs = TrainingArguments(
        output_dir=contract.checkpoint_dir,
        per_device_train_batch_size=batch,
        per_device_eval_batch_size=max(8, batch),
        num_train_epochs=epochs,
        max_steps=(args.profile_steps if contract.profile else (task.max_iterations or -1)),
        eval_strategy="no" if contract.profile or eval_set is None else "epoch",
        save_strategy="no",  # the callback saves when the contract asks
        save_total_limit=2,  # the reported checkpoint and the one before
        logging_strategy="steps",
        logging_steps=max(1, args.logging_steps),
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=args.seed,
        **kw,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=train_set, eval_dataset=eval_set,
                      data_collator=collate, compute_metrics=compute_metrics, callbacks=[callback],
                      preprocess_logits_for_metrics=preprocess_logits)
    if contract.resume_from:
        log(f"resuming from {contract.resume_from}")
    started = time.monotonic()
    trainer.train(resume_from_checkpoint=contract.resume_from)
    if contract.profile:
        loader = trainer.get_train_dataloader()
        batches = []
        for b in loader:
            batches.append({k: v for k, v in b.items()})
            if len(batches) >= 2 * args.probe_batches:
                break
        if len(batches) < 2:
            fail("the Task2Vec probe needs at least two batches of training data")
        fisher, repeat = probe(trainer.model, batches, args.probe_batches, args.seed)
        callback.reporter.embedding(task.job_id, fisher, repeat)
        log(f"profiled {args.profile_steps} steps in {time.monotonic() - started:.1f} s; "
            f"Task2Vec embedding of dimension {len(fisher)}")
    if callback.signals.terminate.is_set():
        at = callback.signals.received.get("terminate")
        log(f"stopped on SIGTERM with a checkpoint, {time.monotonic() - at:.2f} s after the signal" if at
            else "stopped on SIGTERM with a checkpoint")
    callback.reporter.close()
    return 0


def accuracy_metrics(task: Task, regression: bool = False):
    """``compute_metrics`` for classification (accuracy, f1, mcc) or
    regression (pearson); refuses a target metric it does not compute,
    naming ``target.metric``."""
    import numpy as np

    known = {"pearson", "loss"} if regression else {"accuracy", "f1", "mcc", "matthews_correlation", "loss"}
    if task.metric and task.metric not in known:
        fail(f"target.metric {task.metric!r}: this trainer computes {', '.join(sorted(known))}")

    def compute(pred) -> Dict[str, float]:
        logits, labels = pred.predictions, pred.label_ids
        if isinstance(logits, tuple):
            logits = logits[0]
        if regression:
            x = np.asarray(logits).reshape(-1)
            y = np.asarray(labels).reshape(-1)
            r = float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else 0.0
            return {"pearson": r}
        p = np.asarray(logits).argmax(-1)
        y = np.asarray(labels)
        out = {"accuracy": float((p == y).mean())}
        classes = sorted(set(y.tolist()) | set(p.tolist()))
        f1s = []
        for c in classes:
            tp = float(((p == c) & (y == c)).sum())
            fp = float(((p == c) & (y != c)).sum())
            fn = float(((p != c) & (y == c)).sum())
            f1s.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
        out["f1"] = f1s[-1] if len(classes) == 2 else float(np.mean(f1s))
        if len(classes) == 2:
            tp = float(((p == 1) & (y == 1)).sum())
            tn = float(((p == 0) & (y == 0)).sum())
            fp = float(((p == 1) & (y == 0)).sum())
            fn = float(((p == 0) & (y == 1)).sum())
            d = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
            out["mcc"] = 0.0 if d == 0 else (tp * tn - fp * fn) / d
            if task.metric == "matthews_correlation":  # GLUE's name for CoLA's metric
                out["matthews_correlation"] = out["mcc"]
        return out

    return compute


def metric_value(compute, logits, labels, name: str) -> float:
    """One metric of ``compute`` (an :func:`accuracy_metrics` function) on
    predictions made outside HF's ``Trainer`` (a spatial merge's own
    evaluation)."""
    from types import SimpleNamespace

    return compute(SimpleNamespace(predictions=logits, label_ids=labels))[name]


def centroid_accuracy(features_of, train_batches, eval_batches) -> float:
    """How well the current weights separate a watched task's classes: a
    nearest-centroid probe on their features (centroids from the task's
    training examples, accuracy on its validation examples). A temporal
    merge A ↦ B helps when A's training makes B's classes more separable;
    the merge guard watches this number over A's first epochs."""
    import torch

    sums: Dict[int, "torch.Tensor"] = {}
    counts: Dict[int, int] = {}
    with torch.no_grad():
        for feats, labels in (features_of(b) for b in train_batches):
            for f, y in zip(feats, labels.tolist()):
                sums[y] = sums.get(y, 0) + f
                counts[y] = counts.get(y, 0) + 1
        if len(sums) < 2:
            return 0.0
        classes = sorted(sums)
        centroids = torch.stack([sums[c] / counts[c] for c in classes])
        right = total = 0
        for feats, labels in (features_of(b) for b in eval_batches):
            nearest = torch.cdist(feats, centroids).argmin(dim=1)
            right += sum(int(classes[i] == y) for i, y in zip(nearest.tolist(), labels.tolist()))
            total += len(labels)
    return right / max(1, total)
