"""`python -m storage.proxy`: the command line harness, benches and sweep markers start (`"storage.proxy" in cmd`)."""
from storage.proxy.process import main

main()
