"""A toy trainer on the fmsched contract, in plain Python: fits y = 3x + 1
by SGD. It shows the whole contract with the helper — reports, checkpoints
on SIGUSR2 / SIGTERM / periodically, resume, standby (pre-warm), profile mode with a
Task2Vec embedding, done — without a GPU or a framework. Real trainers use
fmsched_trainer.hf.FmschedCallback instead.

    FMSCHED_TASKS='[{"job_id":"j","model":"m","task":"t","dataset_uri":"-","global_batch_size":8,"max_iterations":500}]' \\
    FMSCHED_CHECKPOINT_DIR=/tmp/ck python examples/toy_trainer.py
"""

import json
import os
import random
import sys
import time

from fmsched_trainer import Contract, TrainingSignals, standby, task2vec_embedding


def main() -> int:
    c = Contract()
    sig = TrainingSignals().install()
    rep = c.reporter()
    task = c.tasks[0]
    rng = random.Random(7)
    w, b, it = 0.0, 0.0, 0
    if c.resume_from:
        with open(c.resume_from) as f:
            s = json.load(f)
        w, b, it = s["w"], s["b"], s["iteration"]
        print(f"toy_trainer: resumed from {c.resume_from} at iteration {it}", file=sys.stderr)

    def batch():
        xs = [rng.uniform(-1, 1) for _ in range(task.global_batch_size)]
        return [(x, 3 * x + 1 + rng.gauss(0, 0.01)) for x in xs]

    # Everything above needs no GPU; a standby waits here for its start.
    if standby(c, sig, rep):
        print("toy_trainer: started from standby", file=sys.stderr)

    def grad(data):
        gw = sum(2 * (w * x + b - y) * x for x, y in data) / len(data)
        gb = sum(2 * (w * x + b - y) for x, y in data) / len(data)
        loss = sum((w * x + b - y) ** 2 for x, y in data) / len(data)
        return gw, gb, loss

    def checkpoint():
        path = c.checkpoint_path(it) + ".json"
        with open(path + ".tmp", "w") as f:
            json.dump({"w": w, "b": b, "iteration": it}, f)
        os.replace(path + ".tmp", path)
        rep.checkpoint(path, it)

    last_ckpt = time.monotonic()
    limit = 40 if c.profile else (task.max_iterations or 1000)
    while it < limit:
        t0 = time.monotonic()
        gw, gb, loss = grad(batch())
        w -= 0.05 * gw
        b -= 0.05 * gb
        it += 1
        time.sleep(0.002)
        rep.progress(task.job_id, it, it * task.global_batch_size, loss, time.monotonic() - t0)
        if not c.profile and (sig.checkpoint.is_set() or time.monotonic() - last_ckpt > c.checkpoint_interval_s):
            sig.checkpoint.clear()
            checkpoint()
            last_ckpt = time.monotonic()
        if sig.terminate.is_set():
            if not c.profile:
                checkpoint()
            return 0
    if c.profile:
        batches = [batch() for _ in range(8)]
        f, f2 = task2vec_embedding(batches, lambda d: list(grad(d)[:2]), probe_batches=4)
        rep.embedding(task.job_id, f, f2)
        return 0
    checkpoint()
    out = os.path.join(c.output_path(task.job_id), "weights.json")
    with open(out, "w") as f:
        json.dump({"w": w, "b": b}, f)
    rep.done(task.job_id, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
