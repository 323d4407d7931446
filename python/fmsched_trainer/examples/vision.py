"""Image classification (ViT-style) with HF's ``Trainer`` on the fmsched
trainer contract.

    launch:
      command: [python, -m, fmsched_trainer.examples.vision]

The dataset folder (``dataset.uri``, see
:mod:`fmsched_trainer.examples.common`) holds ``train.npz`` and
``validation.npz``, each with ``images`` (N×H×W×C, uint8) and ``labels``
(N integers); images are scaled to the model's ``image_size``. Metrics:
``accuracy``, ``f1``, ``mcc``. A temporal merge's watched task is scored
with a nearest-centroid probe of the current encoder's [CLS] features; a
spatial merge trains two tasks on one encoder
(:mod:`fmsched_trainer.examples.spatial`).
"""

from __future__ import annotations

import os

from ..contract import standby
from .common import (accuracy_metrics, centroid_accuracy, fail, final_weights, load_model, local_path, log,
                     metric_value, prepare, start, train)


def read_images(uri: str, split: str):
    import numpy as np

    path = local_path(uri)
    if path is None:
        fail(f"dataset.uri {uri}: this trainer reads a local folder (file:// or an absolute path)")
    for name in [split] + (["val", "test"] if split == "validation" else []):
        f = os.path.join(path, f"{name}.npz")
        if os.path.isfile(f):
            d = np.load(f)
            if "images" not in d or "labels" not in d:
                fail(f"{f}: needs arrays 'images' and 'labels'")
            if d["images"].ndim != 4 or len(d["images"]) != len(d["labels"]):
                fail(f"{f}: images must be N×H×W×C with one label each")
            return d["images"], d["labels"]
    fail(f"dataset.uri {uri}: no {split}.npz in {path}")


class Images:
    """A torch dataset of (pixel_values, labels), scaled to ``size``."""

    def __init__(self, images, labels, size: int):
        import torch

        x = torch.tensor(images, dtype=torch.float32).permute(0, 3, 1, 2) / 255.0
        if x.shape[-1] != size or x.shape[-2] != size:
            x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        self.x = (x - 0.5) / 0.5
        self.y = torch.tensor(labels, dtype=torch.long)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}


def spatial(contract, args, signals, reporter) -> int:
    """Two trained tasks: a spatial merge (see
    :mod:`fmsched_trainer.examples.spatial`)."""
    import torch
    from transformers import AutoModelForImageClassification

    from .spatial import train_spatial

    rows, evals, models = [], [], []
    for t in contract.tasks:
        (tx, ty), (vx, vy) = read_images(t.dataset_uri, "train"), read_images(t.dataset_uri, "validation")
        if t.metric and t.metric not in ("accuracy", "f1", "mcc"):
            fail(f"target.metric {t.metric!r} of {t.job_id}: a spatial merge computes accuracy, f1, mcc")
        extra = {"image_size": int(tx.shape[1]), "patch_size": 4, "num_channels": int(tx.shape[3])}
        m, origin = load_model(AutoModelForImageClassification, contract, args, num_labels=int(ty.max()) + 1,
                               **(extra if args.tiny and not contract.init_weights else {}))
        models.append(m)
        size = m.config.image_size
        train_set, eval_set = Images(tx, ty, size), Images(vx, vy, size)
        rows.append([train_set[i] for i in range(len(train_set))])
        evals.append(eval_set)
    log(f"weights from {origin}")
    if standby(contract, signals, reporter):
        log("started from standby")
    models[0] = prepare(models[0], contract.tasks[0], head=["classifier"])
    metrics = [accuracy_metrics(t) for t in contract.tasks]

    def collate_task(items):
        return {"pixel_values": torch.stack([r["pixel_values"] for r in items]),
                "labels": torch.stack([r["labels"] for r in items])}

    def evaluate(k: int) -> float:
        m, ds = models[k], evals[k]
        device = next(m.parameters()).device
        was = m.training
        m.eval()
        with torch.no_grad():
            logits = torch.cat([m(pixel_values=ds.x[i:i + 64].to(device)).logits.cpu()
                                for i in range(0, len(ds), 64)])
        m.train(was)

        return metric_value(metrics[k], logits.numpy(), ds.y.numpy(), contract.tasks[k].metric or "accuracy")

    return train_spatial(contract, args, models, rows, evaluate, collate_task,
                         lambda m, path: final_weights(m).save_pretrained(path), signals, reporter)


def main() -> int:
    args, contract, signals, reporter = start(__doc__.splitlines()[0])
    task = contract.tasks[0]
    from transformers import AutoModelForImageClassification

    if len(contract.tasks) == 2:
        return spatial(contract, args, signals, reporter)

    train_x, train_y = read_images(task.dataset_uri, "train")
    eval_x, eval_y = read_images(task.dataset_uri, "validation")
    labels = int(train_y.max()) + 1
    if standby(contract, signals, reporter):
        log("started from standby")
    extra = {"image_size": int(train_x.shape[1]), "patch_size": 4, "num_channels": int(train_x.shape[3])}
    model, origin = load_model(AutoModelForImageClassification, contract, args, num_labels=labels,
                               **(extra if args.tiny and not contract.init_weights else {}))
    log(f"weights from {origin}; {len(train_y)} training and {len(eval_y)} validation images, {labels} classes")
    model = prepare(model, task, head=["classifier"])
    size = model.config.image_size
    train_set, eval_set = Images(train_x, train_y, size), Images(eval_x, eval_y, size)

    watched = {w.job_id: (read_images(w.dataset_uri, "train"), read_images(w.dataset_uri, "validation"))
               for w in contract.watched}
    for w in contract.watched:
        log(f"watching {w.job_id} ({w.task}) for the merge guard: scored every epoch with these weights")

    def evaluate_watched(w, m):
        import torch

        inner = m.get_base_model() if hasattr(m, "get_base_model") else m
        base = getattr(inner, inner.base_model_prefix)
        device = next(m.parameters()).device
        (tx, ty), (vx, vy) = watched[w.job_id]
        tr, va = Images(tx[:512], ty[:512], size), Images(vx[:512], vy[:512], size)

        def chunks(ds):
            return [(ds.x[i:i + 64], ds.y[i:i + 64]) for i in range(0, len(ds), 64)]

        def features_of(batch):
            return base(pixel_values=batch[0].to(device)).last_hidden_state[:, 0].cpu(), batch[1]

        was = m.training
        m.eval()
        with torch.no_grad():
            acc = centroid_accuracy(features_of, chunks(tr), chunks(va))
        m.train(was)
        return acc

    return train(contract, args, model, train_set, eval_set, None, accuracy_metrics(task),
                 evaluate_watched=evaluate_watched if watched else None,
                 save_output=lambda m, path: final_weights(m).save_pretrained(path), signals=signals,
                 reporter=reporter)


if __name__ == "__main__":
    raise SystemExit(main())
