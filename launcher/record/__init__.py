"""The run's record: what a run was and what it did, kept after it ends.

Holds registry (the SQLite run registry behind ps/logs/stop/attach), recorder (what a
submit writes into it, attempt by attempt), events (events.jsonl, written while the run
goes on), runevents and runlog (reading events and node logs back, for reports).

May import: errors, render, nodeprog, spec, plan. registry and events are standard library
only: `mlaunch ps` imports them.
"""
