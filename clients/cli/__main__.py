"""`python -m ctxd.clients.cli ...`: the same as `ctxd ...` (agent hooks are installed so)."""

import sys

from ctxd.clients.cli.entry import main

sys.exit(main())
