import sys

from tttr.app.cli import main

sys.exit(main())
