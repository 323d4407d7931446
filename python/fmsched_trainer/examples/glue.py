"""Sequence classification (GLUE-style) with HF's ``Trainer`` on the
fmsched trainer contract.

    launch:
      command: [python, -m, fmsched_trainer.examples.glue]

Each example of the dataset (see :mod:`fmsched_trainer.examples.common`
for where it is read from) is a JSON object with a ``label`` (an integer
class; a float makes the task a regression, metric ``pearson``) and its
text in ``sentence``, ``text``, or a pair: ``sentence1``/``sentence2``,
``question``/``sentence``, ``question1``/``question2``,
``premise``/``hypothesis``. Metrics: ``accuracy``, ``f1``, ``mcc``
(``pearson`` for regression).

A temporal merge's watched task (A ↦ B: B evaluated while A trains) is
scored with a nearest-centroid probe of A's current encoder on B's data
(:func:`~fmsched_trainer.examples.common.centroid_accuracy`).
"""

from __future__ import annotations

from ..contract import standby
from .common import (ByteTokenizer, accuracy_metrics, centroid_accuracy, fail, final_weights, load_model, log,
                     metric_value, prepare, read_split, start, train, weights_source)

PAIRS = [("sentence1", "sentence2"), ("question", "sentence"), ("question1", "question2"),
         ("premise", "hypothesis"), ("sentence", None), ("text", None)]


def texts(example: dict, where: str):
    for a, b in PAIRS:
        if a in example and (b is None or b in example):
            return str(example[a]), (str(example[b]) if b else None)
    fail(f"{where}: an example has none of the text fields "
         f"{', '.join(a + ('/' + b if b else '') for a, b in PAIRS)}")


class Encoder:
    """Text → token ids: the model's own tokenizer, or bytes (``--tiny``)."""

    def __init__(self, source, max_length: int):
        self.max_length = max_length
        self.bytes = None
        self.hf = None
        if source is None:
            self.bytes = ByteTokenizer()
        else:
            from transformers import AutoTokenizer

            self.hf = AutoTokenizer.from_pretrained(source)

    @property
    def pad_id(self) -> int:
        return ByteTokenizer.pad if self.bytes else (self.hf.pad_token_id or 0)

    def __call__(self, a: str, b=None):
        if self.bytes:
            return self.bytes.encode(a, b, self.max_length)
        return self.hf(a, b, truncation=True, max_length=self.max_length)["input_ids"]

    def save(self, path: str) -> None:
        if self.hf is not None:
            self.hf.save_pretrained(path)


def encode(examples, encoder: Encoder, where: str, regression: bool):
    out = []
    for n, e in enumerate(examples):
        if "label" not in e:
            fail(f"{where}: example {n + 1} has no label")
        a, b = texts(e, where)
        out.append({"input_ids": encoder(a, b), "labels": float(e["label"]) if regression else int(e["label"])})
    return out


def collator(pad_id: int, regression: bool):
    import torch

    def collate(features):
        width = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(features), width), dtype=torch.long)
        for i, f in enumerate(features):
            ids[i, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
            mask[i, :len(f["input_ids"])] = 1
        labels = torch.tensor([f["labels"] for f in features],
                              dtype=torch.float if regression else torch.long)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return collate


def batches(rows, collate, size: int, limit: int):
    return [collate(rows[i:i + size]) for i in range(0, min(len(rows), limit), size)]


def spatial(contract, args, signals, reporter) -> int:
    """Two trained tasks: a spatial merge (see
    :mod:`fmsched_trainer.examples.spatial`)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from .spatial import train_spatial

    source = weights_source(contract, args)
    encoder = Encoder(source, args.max_length)
    rows, evals, models = [], [], []
    for t in contract.tasks:
        raw = read_split(t.dataset_uri, "train")
        labels = 1 + max(int(e.get("label", 0)) for e in raw)
        rows.append(encode(raw, encoder, t.dataset_uri + " train", False))
        evals.append(encode(read_split(t.dataset_uri, "validation"), encoder, t.dataset_uri + " validation", False))
        if t.metric and t.metric not in ("accuracy", "f1", "mcc"):
            fail(f"target.metric {t.metric!r} of {t.job_id}: a spatial merge computes accuracy, f1, mcc")
        m, origin = load_model(AutoModelForSequenceClassification, contract, args, num_labels=labels)
        models.append(m)
    log(f"weights from {origin}")
    if standby(contract, signals, reporter):
        log("started from standby")
    models[0] = prepare(models[0], contract.tasks[0])
    collate = collator(encoder.pad_id, False)
    metrics = [accuracy_metrics(t) for t in contract.tasks]

    def evaluate(k: int) -> float:
        m = models[k]
        device = next(m.parameters()).device
        preds, labels = [], []
        was = m.training
        m.eval()
        with torch.no_grad():
            for b in batches(evals[k], collate, 64, len(evals[k])):
                logits = m(input_ids=b["input_ids"].to(device), attention_mask=b["attention_mask"].to(device)).logits
                preds.append(logits.cpu())
                labels.append(b["labels"])
        m.train(was)

        return metric_value(metrics[k], torch.cat(preds).numpy(), torch.cat(labels).numpy(),
                            contract.tasks[k].metric or "accuracy")

    def save(m, path):
        final_weights(m).save_pretrained(path)
        encoder.save(path)

    return train_spatial(contract, args, models, rows, evaluate, collate, save, signals, reporter)


def main() -> int:
    args, contract, signals, reporter = start(__doc__.splitlines()[0])
    task = contract.tasks[0]
    from transformers import AutoModelForSequenceClassification

    if len(contract.tasks) == 2:
        return spatial(contract, args, signals, reporter)

    train_raw = read_split(task.dataset_uri, "train")
    eval_raw = read_split(task.dataset_uri, "validation")
    regression = isinstance(train_raw[0].get("label"), float) and not float(train_raw[0]["label"]).is_integer()
    labels = 1 if regression else 1 + max(int(e.get("label", 0)) for e in train_raw)
    source = weights_source(contract, args)
    encoder = Encoder(source, args.max_length)
    train_set = encode(train_raw, encoder, task.dataset_uri + " train", regression)
    eval_set = encode(eval_raw, encoder, task.dataset_uri + " validation", regression)
    collate = collator(encoder.pad_id, regression)
    log(f"task {task.task}: {len(train_set)} training and {len(eval_set)} validation examples, "
        f"{'regression' if regression else f'{labels} classes'}")

    # Everything above needs no GPU: a pre-warmed process waits here.
    if standby(contract, signals, reporter):
        log("started from standby")

    model, origin = load_model(AutoModelForSequenceClassification, contract, args, num_labels=labels,
                               **({"problem_type": "regression"} if regression else {}))
    log(f"weights from {origin}")
    model = prepare(model, task, peft_task_type="SEQ_CLS")

    watched = {}
    for w in contract.watched:
        raw_t, raw_v = read_split(w.dataset_uri, "train"), read_split(w.dataset_uri, "validation")
        watched[w.job_id] = (encode(raw_t, encoder, w.dataset_uri, False), encode(raw_v, encoder, w.dataset_uri, False))
        log(f"watching {w.job_id} ({w.task}) for the merge guard: scored every epoch with these weights")

    def evaluate_watched(w, m):
        import torch

        inner = m.get_base_model() if hasattr(m, "get_base_model") else m
        base = getattr(inner, inner.base_model_prefix)
        device = next(m.parameters()).device

        def features_of(batch):
            out = base(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
            h = out.last_hidden_state
            mask = batch["attention_mask"].to(device).unsqueeze(-1).float()
            return ((h * mask).sum(1) / mask.sum(1)).cpu(), batch["labels"]

        tr, va = watched[w.job_id]
        was = m.training
        m.eval()
        with torch.no_grad():
            acc = centroid_accuracy(features_of, batches(tr, collate, 32, 512), batches(va, collate, 32, 512))
        m.train(was)
        return acc

    def save_output(m, path):
        final_weights(m).save_pretrained(path)
        encoder.save(path)

    return train(contract, args, model, train_set, eval_set, collate, accuracy_metrics(task, regression),
                 evaluate_watched=evaluate_watched if watched else None, save_output=save_output,
                 signals=signals, reporter=reporter)


if __name__ == "__main__":
    raise SystemExit(main())
