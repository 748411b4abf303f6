import sys

from devcluster.cli import main

sys.exit(main())
