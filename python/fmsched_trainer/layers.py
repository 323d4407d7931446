"""Layer freezing (ICEFROG §III) for a task's ``frozen_layers``.

ICEFROG freezes the first l transformer layers (counted from the input):
their weights get no gradients, so the backward pass stops at layer l and
they are not synchronised. :func:`freeze_first_layers` does that to any
``torch.nn.Module``-like model by parameter name: HuggingFace models name
their blocks ``...layer.<i>.`` (BERT, RoBERTa, ViT), ``...layers.<i>.``
(Llama, Mistral), ``...h.<i>.`` (GPT-2) or ``...block.<i>.`` (T5, Switch);
the embeddings sit below layer 0 and are frozen with it. It needs no GPU.

Layer-elastic jobs (the task's ``max_frozen_layers`` > 0): the scheduler's
tuner changes ``frozen_layers`` while the job runs. :func:`set_frozen_layers`
moves the frozen prefix both ways (unfreezing only what was trainable at
the start, so a PETL backbone stays frozen); :class:`LayerVariance`
measures the per-layer gradient variance the trainer reports each epoch
(ICEFROG Eq. 3: a frozen layer keeps the value it had when frozen).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Iterable, List, Optional, Set, Tuple

# "<prefix>.<layer|layers|h|block>.<index>." in a parameter's name.
_LAYER = re.compile(r"(?:^|\.)(?:layer|layers|h|block)\.(\d+)\.")
_EMBEDDING = re.compile(r"(?:^|\.)(?:embeddings|embed_tokens|wte|wpe|shared|patch_embed)(?:\.|$)")


def layer_index(name: str):
    """The transformer layer a parameter belongs to, or None (embeddings,
    heads, final norms)."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def _prefix(params, n: int):
    """Which parameter names the first ``n`` layers (and the embeddings
    below them) hold; raises ValueError naming ``frozen_layers`` when the
    model has fewer layers."""
    if n < 0:
        raise ValueError(f"frozen_layers: {n} is negative")
    layers = {i for name, _ in params if (i := layer_index(name)) is not None}
    if n > 0 and not layers:
        raise ValueError("frozen_layers: no transformer layers found in the model's parameter names")
    if n > len(layers):
        raise ValueError(f"frozen_layers: {n} asked, the model has {len(layers)} layers")

    def frozen(name: str) -> bool:
        i = layer_index(name)
        return n > 0 and ((i is not None and i < n) or (i is None and _EMBEDDING.search(name) is not None))

    return frozen


def freeze_first_layers(model, n: int) -> Tuple[int, int]:
    """Freezes the embeddings and layers ``0 .. n-1`` of ``model``
    (``requires_grad = False``); returns (frozen, trainable) parameter
    tensors. ``n = 0`` freezes nothing. Raises ValueError when ``n``
    exceeds the layers the model's parameter names show, naming both, so
    a spec's ``frozen_layers`` never silently does nothing."""
    params = list(_named(model))
    trainable = {name for name, p in params if p.requires_grad}
    return set_frozen_layers(model, n, trainable)


def set_frozen_layers(model, n: int, trainable: Set[str]) -> Tuple[int, int]:
    """Freezes the embeddings and layers ``0 .. n-1`` and makes every other
    parameter in ``trainable`` (the names trainable when training started)
    trainable again; returns (frozen, trainable) parameter tensors."""
    params = list(_named(model))
    frozen_name = _prefix(params, n)
    frozen = train = 0
    for name, p in params:
        freeze = frozen_name(name)
        p.requires_grad = (not freeze) and name in trainable
        frozen += int(freeze)
        train += int(p.requires_grad)
    return frozen, train


class LayerVariance:
    """Per-layer gradient variance over an epoch: after each backward pass
    :meth:`observe` takes, for every layer with gradients, the variance of
    its gradient entries (``mean(g^2) - mean(g)^2``); :meth:`report` gives
    the epoch's mean per layer, a frozen layer keeping the value it had when
    it was frozen (ICEFROG Eq. 3's ``sigma^2_t0``), and starts the next epoch."""

    def __init__(self, layers: int):
        self.layers = layers
        self._sum = [0.0] * layers
        self._n = [0] * layers
        self._last = [0.0] * layers

    def observe(self, model) -> None:
        acc = {}
        for name, p in _named(model):
            i = layer_index(name)
            g = getattr(p, "grad", None)
            if i is None or i >= self.layers or g is None:
                continue
            gs, gs2, gk = _grad_stats(g)
            s, s2, k = acc.get(i, (0.0, 0.0, 0))
            acc[i] = (s + gs, s2 + gs2, k + gk)
        for i, (s, s2, k) in acc.items():
            if k:
                mean = s / k
                self._sum[i] += max(s2 / k - mean * mean, 0.0)
                self._n[i] += 1

    def report(self) -> List[float]:
        for i in range(self.layers):
            if self._n[i]:
                self._last[i] = self._sum[i] / self._n[i]
        out = list(self._last)
        self._sum = [0.0] * self.layers
        self._n = [0] * self.layers
        return out


def _grad_stats(g) -> Tuple[float, float, int]:
    """(sum, sum of squares, count) of a gradient's entries: a torch tensor,
    or any iterable of numbers."""
    if hasattr(g, "detach"):
        flat = g.detach().float().reshape(-1)
        return float(flat.sum()), float((flat * flat).sum()), int(flat.numel())
    vals = [float(x) for x in g]
    return sum(vals), sum(x * x for x in vals), len(vals)


def read_control(path: Optional[str]) -> dict:
    """The scheduler's changes to a running process (the agent's control
    file, FMSCHED_CONTROL_FILE): {} when there are none."""
    if not path:
        return {}
    try:
        with open(path) as f:
            c = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        print(f"fmsched_trainer: control file {path}: {e}; ignored", file=sys.stderr)
        return {}
    return c if isinstance(c, dict) else {}


class LeaseWatch:
    """The lease end the agent writes to the control file (``lease_end``,
    Unix seconds; leasing policies only). :meth:`due` is true once per
    lease end, when it is at most ``ahead`` seconds away: checkpoint then,
    and a suspension at the end loses nothing. The file is re-read only
    when it changed, so calling it every step costs one ``stat``."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self._seen = None
        self.end: Optional[float] = None
        self._done_for: Optional[float] = None

    def due(self, ahead: float, now: Optional[float] = None) -> Optional[float]:
        """Seconds left when a checkpoint is due now, else None."""
        if not self.path:
            return None
        try:
            seen = os.stat(self.path).st_mtime_ns
        except OSError:
            seen = None
        if seen is not None and seen != self._seen:
            self._seen = seen
            end = read_control(self.path).get("lease_end")
            self.end = float(end) if isinstance(end, (int, float)) else None
        if self.end is None or self.end == self._done_for:
            return None
        left = self.end - (time.time() if now is None else now)
        if left > ahead:
            return None
        self._done_for = self.end
        return left


def _named(model) -> Iterable:
    named = getattr(model, "named_parameters", None)
    if named is None:
        raise TypeError("freeze_first_layers: the model has no named_parameters()")
    return named()
