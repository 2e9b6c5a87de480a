"""One run from start to end: the attempt loop and the backends that drive it.

Holds attempts (submit: connect, preflight, guard output_dir, run, restart from the latest
complete checkpoint), outputdir (checkpoint discovery and the run's lock on node 0),
finished (whether a checkpoint already ends the schedule), backend (the interface, after
torchx's scheduler: dryrun, submit, run, describe, logs, cancel), backends (the factory that
picks one, and `launch`), process (the ssh/local backend and its detached supervisor),
slurm_backend, supervisor (the detached run's process) and sweep (stop's scoped teardown).

May import every layer below it: errors, render, nodeprog, spec, plan, record, view,
execute, preflight. Only the CLI imports it.
"""
