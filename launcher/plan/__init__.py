"""The plan: pure and immutable, what `submit` will do, decided before anything starts.

Holds launch_plan (LaunchPlan, NodePlan, build_plan), batch (per_device, grad_accum and
checkpointing from the memory estimate), memory (the per-GPU formula), meminputs (where the
estimate's inputs come from), trainers (each trainer's rendered files and arguments),
defaults (each trainer's own defaults).

May import: errors, render, nodeprog, spec. Touches no node and starts no process.
"""
