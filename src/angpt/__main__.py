import sys

from angpt.cli import main

sys.exit(main())
