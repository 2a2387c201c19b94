"""`python -m ctxd.daemon serve ...`: the same as `ctxd serve ...`."""

import sys

from ctxd.clients.cli.entry import main

sys.exit(main(sys.argv[1:]))
