"""``python -m taskmap.backends.hip FILE --arch gfx90a``: compile with hipRTC as taskmap does."""
import sys

from .hiprtc import main

sys.exit(main())
