"""``python -m fleet.lazyfs``: serve a lazy mount, or one control call (the sweep finds the serving process by
this module path: `fleet.lazyfs serve` in its command line)."""
import sys

from fleet.lazyfs.client import main

sys.exit(main())
