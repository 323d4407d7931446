"""Supervised fine-tuning of a causal language model (Llama/GPT-2 style)
with HF's ``Trainer`` on the fmsched trainer contract.

    launch:
      command: [python, -m, fmsched_trainer.examples.sft]

Each example (``train.jsonl`` / ``validation.jsonl``, see
:mod:`fmsched_trainer.examples.common`) is ``{"prompt": …, "response": …}``
(the loss is taken on the response only) or ``{"text": …}`` (on all of it).
Metrics: ``token_accuracy`` (next-token accuracy on the trained tokens) and
``loss`` (set ``lower_is_better: true`` on a loss target). A prompt-tuning
job (``kind: prompt_tuning``) trains a soft prompt only and writes it as
its output (a peft prompt adapter and ``prompt.json``); launched warm
(``FMSCHED_WARM=1``) its process then waits with the model loaded and
serves the next prompt-tuning task of the same model it is handed
(PromptTuner's warm pools). A temporal
merge's watched task is scored by its token accuracy with the current
weights: both tasks share the language-model head.
"""

from __future__ import annotations

from ..contract import next_task, standby
from .common import (ByteTokenizer, fail, final_weights, load_model, log, prepare, read_split, save_prompt, start,
                     train, weights_source)

IGNORE = -100


class Encoder:
    def __init__(self, source, max_length: int):
        self.max_length = max_length
        self.hf = None
        if source is not None:
            from transformers import AutoTokenizer

            self.hf = AutoTokenizer.from_pretrained(source)
        self.pad_id = ByteTokenizer.pad if self.hf is None else (self.hf.pad_token_id or self.hf.eos_token_id or 0)

    def ids(self, text: str, first: bool):
        if self.hf is None:
            return ([ByteTokenizer.start] if first else []) + [b + 3 for b in text.encode()]
        return self.hf(text, add_special_tokens=first)["input_ids"]

    def end(self):
        return [ByteTokenizer.sep if self.hf is None else (self.hf.eos_token_id or 0)]

    def save(self, path):
        if self.hf is not None:
            self.hf.save_pretrained(path)


def encode(examples, enc: Encoder, where: str):
    out = []
    for n, e in enumerate(examples):
        if "prompt" in e and "response" in e:
            p = enc.ids(str(e["prompt"]) + "\n", True)
            r = enc.ids(str(e["response"]), False) + enc.end()
            ids, labels = p + r, [IGNORE] * len(p) + r
        elif "text" in e:
            ids = enc.ids(str(e["text"]), True) + enc.end()
            labels = list(ids)
        else:
            fail(f"{where}: example {n + 1} has neither prompt/response nor text")
        out.append({"input_ids": ids[:enc.max_length], "labels": labels[:enc.max_length]})
    return out


def collator(pad_id: int):
    import torch

    def collate(features):
        width = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), width), pad_id, dtype=torch.long)
        labels = torch.full((len(features), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(features), width), dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            ids[i, :n] = torch.tensor(f["input_ids"])
            labels[i, :n] = torch.tensor(f["labels"])
            mask[i, :n] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return collate


def without_prompt(logits, width: int):
    """The logits of the input's own positions: prompt tuning prepends its
    virtual tokens, whose positions have no labels."""
    return logits[:, logits.shape[1] - width:]


def token_accuracy(predicted, labels) -> float:
    """Next-token accuracy on the trained (labelled) positions: the token
    at position t is predicted from position t-1."""
    import numpy as np

    p, y = np.asarray(predicted)[:, :-1], np.asarray(labels)[:, 1:]
    keep = y != IGNORE
    return float((p[keep] == y[keep]).mean()) if keep.any() else 0.0


def token_accuracy_of(m, rows, collate) -> float:
    """Next-token accuracy of model ``m`` on ``rows`` (trained positions)."""
    import torch

    device = next(m.parameters()).device
    right = total = 0
    was = m.training
    m.eval()
    with torch.no_grad():
        for i in range(0, len(rows), 32):
            b = collate(rows[i:i + 32])
            logits = m(input_ids=b["input_ids"].to(device), attention_mask=b["attention_mask"].to(device)).logits
            logits = without_prompt(logits, b["input_ids"].shape[1])
            p, y = logits.argmax(-1)[:, :-1].cpu(), b["labels"][:, 1:]
            keep = y != IGNORE
            right += int((p[keep] == y[keep]).sum())
            total += int(keep.sum())
    m.train(was)
    return right / max(1, total)


def spatial(contract, args, signals, reporter) -> int:
    """Two trained tasks: a spatial merge (see
    :mod:`fmsched_trainer.examples.spatial`): one shared decoder, a
    language-model head per task. Token accuracy is the metric (a loss
    target is not supported here)."""
    from transformers import AutoModelForCausalLM

    from .spatial import train_spatial

    for t in contract.tasks:
        if t.metric == "loss":
            fail(f"target.metric 'loss' of {t.job_id}: a spatial merge here stops on token_accuracy")
    enc = Encoder(weights_source(contract, args), args.max_length)
    rows, evals, models = [], [], []
    for t in contract.tasks:
        rows.append(encode(read_split(t.dataset_uri, "train"), enc, t.dataset_uri + " train"))
        evals.append(encode(read_split(t.dataset_uri, "validation"), enc, t.dataset_uri + " validation")[:512])
        m, origin = load_model(AutoModelForCausalLM, contract, args)
        models.append(m)
    log(f"weights from {origin}")
    if standby(contract, signals, reporter):
        log("started from standby")
    models[0] = prepare(models[0], contract.tasks[0], peft_task_type="CAUSAL_LM")
    collate = collator(enc.pad_id)

    def save(m, path):
        final_weights(m).save_pretrained(path)
        enc.save(path)

    return train_spatial(contract, args, models, rows, lambda k: token_accuracy_of(models[k], evals[k], collate),
                         collate, save, signals, reporter, metric="token_accuracy")


def main() -> int:
    args, contract, signals, reporter = start(__doc__.splitlines()[0], petl=("", "lora", "prompt_tuning"))
    base = None
    while True:
        code, base = run(args, contract, signals, reporter, base)
        # A warm prompt-tuning process serves the next request of its model
        # with the model still loaded (PromptTuner's warm pools).
        if code != 0 or base is None or signals.terminate.is_set():
            return code
        nxt = next_task(contract, signals, contract.reporter())
        if nxt is None:
            return 0
        contract = nxt
        for t in contract.tasks:
            if t.petl != "prompt_tuning" or t.model != contract.tasks[0].model:
                fail(f"a warm process serves prompt-tuning tasks of its model; got petl {t.petl!r} of {t.model}")
        log(f"warm start of job {contract.tasks[0].job_id}: the model is loaded already (no weight load)")
        reporter = contract.reporter()


def run(args, contract, signals, reporter, base=None):
    """Trains the contract's task; ``base`` is a warm process's loaded
    model (None: load it). Returns the exit code, and the model to keep
    loaded for the next task when this one was a warm prompt-tuning task
    (else None)."""
    task = contract.tasks[0]
    for t in contract.tasks:
        if t.metric and t.metric not in ("token_accuracy", "loss"):
            fail(f"target.metric {t.metric!r}: this trainer computes token_accuracy and loss")
    from transformers import AutoModelForCausalLM

    if len(contract.tasks) == 2:
        return spatial(contract, args, signals, reporter), None

    enc = Encoder(weights_source(contract, args), args.max_length)
    train_set = encode(read_split(task.dataset_uri, "train"), enc, task.dataset_uri + " train")
    eval_set = encode(read_split(task.dataset_uri, "validation"), enc, task.dataset_uri + " validation")
    collate = collator(enc.pad_id)
    if standby(contract, signals, reporter):
        log("started from standby")
    warm = contract.warm and task.petl == "prompt_tuning" and not contract.watched
    if base is not None and not contract.init_weights:
        model, origin = base, "the warm process's loaded model"
    else:
        model, origin = load_model(AutoModelForCausalLM, contract, args)
    loaded = model
    log(f"weights from {origin}; {len(train_set)} training and {len(eval_set)} validation examples")
    prompt_ids = enc.ids(task.initial_prompt, True) if task.initial_prompt else []
    model = prepare(model, task, peft_task_type="CAUSAL_LM", prompt_ids=prompt_ids)
    if task.petl == "prompt_tuning" and task.prompt_bank and not task.initial_prompt and not contract.resume_from:
        from ..prompts import pick_from_bank

        # Eq. 4.1 on 16 training samples, no tuning.
        picked = pick_from_bank(model, task.prompt_bank, [collate(train_set[:16])], log=log)
        if picked is None:
            log("Prompt Bank: no candidate could be scored; starting from random embeddings")
        else:
            source, score, scored, candidates = picked
            log(f"Prompt Bank: started from job {source}'s prompt (score {score:.4f}; {scored} of {candidates} "
                "prompts scored)")
            reporter.prompt_init(task.job_id, source, score, scored, candidates)

    def compute(pred):
        return {"token_accuracy": token_accuracy(pred.predictions, pred.label_ids)}

    watched = {w.job_id: encode(read_split(w.dataset_uri, "validation"), enc, w.dataset_uri)[:256]
               for w in contract.watched}
    for w in contract.watched:
        log(f"watching {w.job_id} ({w.task}) for the merge guard: scored every epoch with these weights")

    def evaluate_watched(w, m):
        return token_accuracy_of(m, watched[w.job_id], collate)

    def save_output(m, path):
        if task.petl == "prompt_tuning":
            save_prompt(m, task, path)
        else:
            final_weights(m).save_pretrained(path)
        enc.save(path)

    code = train(contract, args, model, train_set, eval_set, collate, compute,
                 preprocess_logits=lambda logits, labels: without_prompt(logits, labels.shape[1]).argmax(-1),
                 evaluate_watched=evaluate_watched if watched else None, save_output=save_output,
                 signals=signals, reporter=reporter)
    # Prompt tuning leaves the model's own weights as they were (frozen):
    # the next request wraps the same model in a fresh prompt.
    return code, (loaded if warm else None)


if __name__ == "__main__":
    raise SystemExit(main())
