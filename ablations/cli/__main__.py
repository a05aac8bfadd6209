"""``python -m ablations.cli``: the ``attn-zoo`` command."""

import sys

from ablations.cli import main

sys.exit(main())
