"""Shrink a Plan (and a re-plan) to a run one host can afford, and say what changed."""
