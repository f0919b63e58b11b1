"""Entry point for ``python -m deploy_opt``: the CLI under its supervisor (``deploy_opt/cli/supervise.py``)."""

import sys

from deploy_opt.cli.supervise import entry

sys.exit(entry())
