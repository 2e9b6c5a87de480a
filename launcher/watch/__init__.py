"""Watching an attempt: progress, hangs, NaN or zero losses, the world size the ranks joined,
hardware-looking errors and py-spy stack dumps.

Holds health (the per-line monitor and its verdicts), world_lines (the lines that state the
world a job's ranks joined), hwcause (hardware-looking errors), stacks (stack dumps on a
hang), watch (one attempt's watch and event log).

May import: errors, render, nodeprog, spec, plan, record, view, logs.
"""
