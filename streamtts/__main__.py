"""``python -m streamtts`` = the ``streamtts`` command."""

from .cli import main

raise SystemExit(main())
