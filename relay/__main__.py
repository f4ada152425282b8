"""``python -m relay``: the ``relay`` command."""

import sys

from relay.cli import main

sys.exit(main())
