"""`python -m cluster.cli`: the same as the installed `sandfleet`."""
from cluster.cli import main

main()
