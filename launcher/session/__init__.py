"""One attempt on every node: start them all, move each node's output into its log, fail
fast, tear down everywhere, and say what each node came to.

Holds attempt (the session: run_job), nodeoutput (one node's output on its one path),
outcome (what each node came to), fanout (`mlaunch exec` on every node).

May import: errors, render, nodeprog, spec, plan, record, view, logs, watch, transport.
"""
