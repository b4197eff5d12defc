"""What GPU failures cost: which GPUs fail (sampling), re-planning a job around them (replan,
sweep), checkpoint intervals, and goodput over weeks of training (simulator)."""
