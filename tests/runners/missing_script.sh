#!/bin/sh
# A wrapper whose script is not there (a typo, a checkout without it): python says why on stderr, then exits 2.
exec python3 /no/such/dir/agent.py "$@"
