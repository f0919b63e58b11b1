"""Entry point for ``python -m deploy_opt``."""

import sys

from deploy_opt.cli import main

sys.exit(main())
