import sys

from quorum.cli import main

sys.exit(main())
