"""`python -m candle_web.serve`: the same as `candle-web serve`."""
import sys

from . import main

sys.exit(main())
