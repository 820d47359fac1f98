"""`python -m streamtts.cli`: the same as `streamtts` (and `python -m streamtts`)."""

import sys

from . import main

sys.exit(main())
