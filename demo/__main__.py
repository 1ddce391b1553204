"""`python -m demo`: run the demo from the checkout (what `make run` does)."""

import sys

from demo.run import main

sys.exit(main())
