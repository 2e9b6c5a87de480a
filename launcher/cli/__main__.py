"""`python -m launcher.cli`: the same as the `mlaunch` command."""
from .main import main

main()
