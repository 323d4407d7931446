"""Small synthetic datasets in the layout the example trainers read, for
tests and demos that must not download anything:

    python -m fmsched_trainer.examples.synthetic glue  /data/sent-a --seed 1
    python -m fmsched_trainer.examples.synthetic vision /data/shapes
    python -m fmsched_trainer.examples.synthetic sft   /data/echo

``glue``: sentences of sentiment words with a 0/1 label (``--flip`` swaps
the vocabularies: a related task whose classes use the same words);
``vision``: 16×16 RGB images of a bright square in one of four quadrants,
labelled by quadrant (``train.npz`` / ``validation.npz``); ``sft``:
prompt/response pairs where the response repeats the prompt's words in
reverse order.
"""

from __future__ import annotations

import argparse
import json
import os
import random

POSITIVE = "good great fine nice lovely superb happy bright".split()
NEGATIVE = "bad awful poor sad terrible grim dull ugly".split()


def glue(out: str, seed: int, train: int, validation: int, flip: bool = False) -> None:
    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    for split, n in (("train", train), ("validation", validation)):
        with open(os.path.join(out, f"{split}.jsonl"), "w") as f:
            for _ in range(n):
                label = rng.randrange(2)
                words = POSITIVE if (label == 1) != flip else NEGATIVE
                f.write(json.dumps({"sentence": " ".join(rng.choice(words) for _ in range(6)), "label": label}) + "\n")


def vision(out: str, seed: int, train: int, validation: int) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    os.makedirs(out, exist_ok=True)
    for split, n in (("train", train), ("validation", validation)):
        images = rng.integers(0, 60, size=(n, 16, 16, 3), dtype=np.uint8)
        labels = rng.integers(0, 4, size=n)
        for i, q in enumerate(labels):
            y, x = divmod(int(q), 2)
            images[i, y * 8 + 2:y * 8 + 6, x * 8 + 2:x * 8 + 6, :] = 230
        np.savez(os.path.join(out, f"{split}.npz"), images=images, labels=labels)


def sft(out: str, seed: int, train: int, validation: int) -> None:
    rng = random.Random(seed)
    words = POSITIVE + NEGATIVE
    os.makedirs(out, exist_ok=True)
    for split, n in (("train", train), ("validation", validation)):
        with open(os.path.join(out, f"{split}.jsonl"), "w") as f:
            for _ in range(n):
                prompt = [rng.choice(words) for _ in range(3)]
                f.write(json.dumps({"prompt": " ".join(prompt), "response": " ".join(reversed(prompt))}) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=["glue", "vision", "sft"])
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--train", type=int, default=512)
    p.add_argument("--validation", type=int, default=128)
    p.add_argument("--flip", action="store_true", help="glue: swap the label vocabularies")
    a = p.parse_args()
    if a.kind == "glue":
        glue(a.out, a.seed, a.train, a.validation, a.flip)
    elif a.kind == "vision":
        vision(a.out, a.seed, a.train, a.validation)
    else:
        sft(a.out, a.seed, a.train, a.validation)
    print(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
