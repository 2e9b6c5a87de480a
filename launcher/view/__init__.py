"""How a plan or a run reads to a person: the dry-run, the memory table, the live node view,
the end-of-run summary and the report.

Holds dryrun (the per-node blocks), present (the dry-run text of a plan and a
run's result), plandata (a plan as data: the dry-run's JSON and the registry's record), memview (the memory plan as a table or JSON), nodeview (the live per-node
status lines), report (loss, learning rate and samples/s as PNG and Markdown).

May import: errors, render, nodeprog, spec, plan, record. Prints nothing itself; it returns
text for the CLI and the job session to print.
"""
