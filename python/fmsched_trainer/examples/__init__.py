"""Real example trainers on the fmsched trainer contract (PyTorch and
HuggingFace ``transformers``; see docs/trainer-contract.md, *Example
trainers*): :mod:`.glue` (sequence classification, spatial merges),
:mod:`.vision` (image classification), :mod:`.sft` (causal-LM supervised
fine-tuning), :mod:`.synthetic` (small datasets for tests and demos)."""
