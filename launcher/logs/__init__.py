"""Node output as people read it: the node-prefixed console, the per-node log files, one tail
of a growing file, torchrun's root cause.

Holds stream (the Printer and its node prefixes, NodeLog, line splitting), tail (whole lines
of a file that may still grow: the console, `logs -f`, `attach` and a scheduler's follow all read
through it), console (the bounded console that follows the node logs at its own pace),
torchrun_out (torchrun's root-cause report).

May import: errors, render, nodeprog, spec, plan, record, view.
"""
