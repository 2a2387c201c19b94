"""`python -m ctxd.protocol` prints the protocol as one JSON Schema (see schema.py)."""

import sys

from ctxd.protocol.schema import main

sys.exit(main())
