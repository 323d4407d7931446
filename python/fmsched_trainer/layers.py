"""Layer freezing (ICEFROG §III) for a task's ``frozen_layers``.

ICEFROG freezes the first l transformer layers (counted from the input):
their weights get no gradients, so the backward pass stops at layer l and
they are not synchronised. :func:`freeze_first_layers` does that to any
``torch.nn.Module``-like model by parameter name: HuggingFace models name
their blocks ``...layer.<i>.`` (BERT, RoBERTa, ViT), ``...layers.<i>.``
(Llama, Mistral), ``...h.<i>.`` (GPT-2) or ``...block.<i>.`` (T5, Switch);
the embeddings sit below layer 0 and are frozen with it. It needs no GPU.
"""

from __future__ import annotations

import re
from typing import Iterable, Tuple

# "<prefix>.<layer|layers|h|block>.<index>." in a parameter's name.
_LAYER = re.compile(r"(?:^|\.)(?:layer|layers|h|block)\.(\d+)\.")
_EMBEDDING = re.compile(r"(?:^|\.)(?:embeddings|embed_tokens|wte|wpe|shared|patch_embed)(?:\.|$)")


def layer_index(name: str):
    """The transformer layer a parameter belongs to, or None (embeddings,
    heads, final norms)."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def freeze_first_layers(model, n: int) -> Tuple[int, int]:
    """Freezes the embeddings and layers ``0 .. n-1`` of ``model``
    (``requires_grad = False``); returns (frozen, trainable) parameter
    tensors. ``n = 0`` freezes nothing. Raises ValueError when ``n``
    exceeds the layers the model's parameter names show, naming both, so
    a spec's ``frozen_layers`` never silently does nothing."""
    if n < 0:
        raise ValueError(f"frozen_layers: {n} is negative")
    params = list(_named(model))
    layers = {i for name, _ in params if (i := layer_index(name)) is not None}
    if n > 0 and not layers:
        raise ValueError("frozen_layers: no transformer layers found in the model's parameter names")
    if n > len(layers):
        raise ValueError(f"frozen_layers: {n} asked, the model has {len(layers)} layers")
    frozen = trainable = 0
    for name, p in params:
        i = layer_index(name)
        freeze = n > 0 and ((i is not None and i < n) or (i is None and _EMBEDDING.search(name) is not None))
        if freeze:
            p.requires_grad = False
            frozen += 1
        elif p.requires_grad:
            trainable += 1
    return frozen, trainable


def _named(model) -> Iterable:
    named = getattr(model, "named_parameters", None)
    if named is None:
        raise TypeError("freeze_first_layers: the model has no named_parameters()")
    return named()
