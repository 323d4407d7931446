"""fmsched_trainer: the training-process side of fmsched's trainer contract
(docs/trainer-contract.md in the fmsched repository).

- :class:`Contract` reads what the node agent gives a trainer (tasks, mode,
  checkpoint folder, resume path, initial weights, ranks) and turns the
  contract's signals into flags the training loop polls; :func:`standby`
  waits, loader ready, for the start of a pre-warmed switch (Ymir §6.2);
  :func:`next_task` keeps a warm process (PromptTuner's warm pools) waiting,
  its model loaded, for its next task.
- :class:`Reporter` writes the JSON-line reports (progress, eval, embedding,
  checkpoint, prewarmed, warm, done) to the agent's socket.
- :func:`freeze_first_layers` freezes a task's ``frozen_layers`` (ICEFROG)
  in a model, by parameter name.
- :func:`diagonal_fisher` is the Task2Vec probe: the diagonal of the Fisher
  information of the trainable parameters, from per-batch gradients.
- :mod:`fmsched_trainer.hf` has a HuggingFace ``Trainer`` callback built on
  these (imported only when ``transformers`` is installed).
- :mod:`fmsched_trainer.prompts` has the Prompt Bank's trainer side for
  prompt-tuning jobs: a soft prompt's activation features and Eq. 4.1's
  score of a candidate initial prompt (needs ``torch`` and ``peft``).
"""

from .contract import Contract, Reporter, Task, TrainingSignals, next_task, standby
from .fisher import diagonal_fisher, task2vec_embedding
from .layers import LayerVariance, LeaseWatch, freeze_first_layers, layer_index, read_control, set_frozen_layers

__all__ = [
    "Contract",
    "Reporter",
    "Task",
    "TrainingSignals",
    "diagonal_fisher",
    "freeze_first_layers",
    "layer_index",
    "LayerVariance",
    "LeaseWatch",
    "next_task",
    "read_control",
    "set_frozen_layers",
    "standby",
    "task2vec_embedding",
]
