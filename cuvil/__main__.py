"""``python -m cuvil``."""

from __future__ import annotations

import sys

from cuvil.cli import main

sys.exit(main())
