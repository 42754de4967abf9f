"""``python -m kvscope.diagnostics``: the kv-diagnose CLI."""

import sys

from kvscope.diagnostics.cli import main

sys.exit(main())
