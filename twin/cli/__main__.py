"""`python -m twin.cli`: the `twin` command."""

import sys

from twin.cli import main

sys.exit(main())
