"""Write tests/costs.json from a suite run's CPU accounting (tests/cpuacct.py's JSON, named at
the end of every run): each test file's CPU seconds and its test count. tests/conftest.py
hands the heaviest groups to the xdist workers first; a stale or missing table only orders
worse, it never changes what runs.

  python tools/test_costs.py /tmp/mlaunch-test-cpu-XXXX.json
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "costs.json")


def main(path: str) -> None:
    cpu, tests = Counter(), Counter()
    for row in json.load(open(path)):
        name = row["test"].split("::")[0]
        cpu[name] += row["cpu_s"]
        tests[name] += row["phase"] == "call"
    table = {f: [round(cpu[f], 1), tests[f]] for f in sorted(cpu) if tests[f]}
    lines = [f"  {json.dumps(f)}: {json.dumps(v)}" for f, v in table.items()]
    with open(OUT, "w") as fh:
        fh.write('{"what": "CPU seconds and tests per file, from one suite run (tools/test_costs.py)",\n'
                 ' "files": {\n' + ",\n".join(lines) + "\n}}\n")
    print(f"{OUT}: {len(table)} files, {sum(v[0] for v in table.values()):.0f} CPU s")


if __name__ == "__main__":
    main(sys.argv[1])
