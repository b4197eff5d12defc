"""The model the executor trains, written plainly: the single-process reference, its mixture of
experts, and the batch. No communication."""
