"""Soft prompts for the Prompt Bank (PromptTuner, thesis 004 §4.4.3): the
activation features a prompt is clustered by, and Eq. 4.1's score of a
candidate initial prompt — the model's mean loss on a few samples with the
candidate as its soft prompt, no tuning. Both work on a ``peft``
prompt-tuning model (``PromptTuningConfig``, the ``sft`` example's).

A tuned prompt is stored as peft saves it (``adapter_model.safetensors``
holding ``prompt_embeddings``, one row per virtual token); a candidate with
another length is repeated or cut to the model's prompt length, as a text
initialisation is.
"""

from __future__ import annotations

import os
from typing import Iterable, List, Mapping


def prompt_rows(model):
    """The prompt's embeddings of a peft prompt-tuning model: one row per
    virtual token (a view of the trained parameter)."""
    return model.prompt_encoder[model.active_adapter].embedding.weight


def load_prompt(path: str):
    """A tuned prompt's embeddings (rows per virtual token) from its peft
    directory (or the ``.safetensors`` file itself)."""
    from safetensors.torch import load_file

    f = os.path.join(path, "adapter_model.safetensors") if os.path.isdir(path) else path
    tensors = load_file(f)
    if "prompt_embeddings" not in tensors:
        raise ValueError(f"{f}: not a prompt-tuning adapter (no prompt_embeddings)")
    return tensors["prompt_embeddings"]


def fit_rows(rows, n: int):
    """``rows`` repeated or cut to ``n`` rows."""
    import torch

    k = rows.shape[0]
    return rows[torch.arange(n) % k]


def prompt_features(model) -> List[float]:
    """The activation features of the model's current soft prompt
    (§4.4.3.1: an LLM's activations for the prompt): the base model's last
    hidden state over the virtual tokens fed alone, averaged over them."""
    import torch

    base = model.get_base_model()
    rows = prompt_rows(model)
    was = base.training
    base.eval()
    with torch.no_grad():
        out = base(inputs_embeds=rows.detach().unsqueeze(0).to(next(base.parameters()).dtype),
                   output_hidden_states=True)
    base.train(was)
    return [float(x) for x in out.hidden_states[-1][0].mean(0).float().cpu()]


def score_prompt(model, candidate, batches: Iterable[Mapping]) -> float:
    """Eq. 4.1: the model's mean loss over ``batches`` (dicts of
    ``input_ids``, ``attention_mask``, ``labels``; about 16 samples) with
    ``candidate`` — a tensor of prompt rows, or a tuned prompt's path — as
    its soft prompt, without tuning. The model's own prompt is restored
    afterwards. Lower is better."""
    import torch

    if isinstance(candidate, (str, os.PathLike)):
        candidate = load_prompt(str(candidate))
    weight = prompt_rows(model)
    saved = weight.detach().clone()
    was = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            weight.copy_(fit_rows(candidate.to(weight.device, weight.dtype), weight.shape[0]))
            device = weight.device
            for b in batches:
                out = model(**{k: v.to(device) for k, v in b.items()})
                total += float(out.loss) * len(b["input_ids"])
                count += len(b["input_ids"])
    finally:
        with torch.no_grad():
            weight.copy_(saved)
        model.train(was)
    if count == 0:
        raise ValueError("score_prompt: no samples to score on")
    return total / count
