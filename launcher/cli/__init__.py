"""The `mlaunch` commands: parsing the command line, printing, exit codes.

Holds main (the group: check, submit, resume, render, schema), validate, dryrun (submit
--dry-run's printing), exec_cmd (`mlaunch exec`), runs (ps, logs,
stop, attach), plan (`mlaunch plan`), report (`mlaunch report`), logview (reading and
following a run's logs) and writeout (`render --out`). `python -m launcher.cli` runs main.

May import every layer. Heavy imports (fabric, torch) stay off each command's import path.
"""
