import sys

from quorum.cli import main

sys.exit(main(["dev", *sys.argv[1:]]))
