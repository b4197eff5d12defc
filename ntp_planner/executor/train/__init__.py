"""Training: one rank's stage, the step, the runtime and the launcher."""
