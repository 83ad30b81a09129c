"""`python -m corral`: the `corral` command, from a checkout or an install."""

import sys

from corral.main import main

sys.exit(main())
