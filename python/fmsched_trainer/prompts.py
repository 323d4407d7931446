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

import json
import os
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple


def prompt_rows(model):
    """The prompt's embeddings of a peft prompt-tuning model: one row per
    virtual token (a view of the trained parameter)."""
    return model.prompt_encoder[model.active_adapter].embedding.weight


def load_prompt(path: str):
    """A tuned prompt's embeddings (rows per virtual token) from its peft
    directory (or the ``.safetensors`` file itself)."""
    from safetensors.torch import load_file

    if os.path.basename(path) == "prompt.json":
        path = os.path.dirname(path)
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


def walk_bank(candidates: List[Mapping], score: Callable[[Mapping], float]) -> Optional[Tuple[Mapping, float, int]]:
    """The Prompt Bank lookup (§4.4.3.2; the scheduler's
    ``fmsched_core::trainer::walk_bank``): score each cluster's medoid, then
    the other members of the best medoid's cluster; the lowest score wins.
    Returns (candidate, score, scorings made), None for an empty bank."""
    clusters: Dict[int, List[Mapping]] = {}
    for c in candidates:
        clusters.setdefault(int(c.get("cluster", 0)), []).append(c)
    scored = 0
    best_cluster = None
    for k in sorted(clusters):
        members = clusters[k]
        medoid = next((c for c in members if c.get("medoid")), members[0])
        s = score(medoid)
        scored += 1
        if best_cluster is None or s < best_cluster[0]:
            best_cluster = (s, medoid, members)
    if best_cluster is None:
        return None
    best_score, best, members = best_cluster
    for c in members:
        if c is best:
            continue
        s = score(c)
        scored += 1
        if s < best_score:
            best_score, best = s, c
    return best, best_score, scored


def pick_from_bank(model, bank_file: str, batches: List[Mapping], log=None):
    """Starts the model's soft prompt from the best candidate of a Prompt
    Bank file (Eq. 4.1 scores over ``batches``, about 16 samples). A
    candidate that cannot be read scores +inf. Returns (candidate id,
    score, scorings, candidates), or None when no candidate could be
    scored (the prompt is left as it was)."""
    import math

    import torch

    with open(bank_file) as f:
        bank = json.load(f)

    def score(c: Mapping) -> float:
        try:
            return score_prompt(model, c["path"], batches)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            if log:
                log(f"Prompt Bank: candidate {c.get('id')}: {e}; skipped")
            return math.inf

    found = walk_bank(bank, score)
    if found is None or not math.isfinite(found[1]):
        return None
    best, best_score, scored = found
    weight = prompt_rows(model)
    with torch.no_grad():
        weight.copy_(fit_rows(load_prompt(best["path"]).to(weight.device, weight.dtype), weight.shape[0]))
    return str(best["id"]), best_score, scored, len(bank)
