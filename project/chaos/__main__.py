"""``python -m project.chaos``: see ``project.chaos.harness``."""

import sys

from .harness import main

sys.exit(main())
