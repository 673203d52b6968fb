"""``python -m taskmap.backends.cuda FILE --arch sm_90``: compile with NVRTC as taskmap does."""
import sys

from .nvrtc import main

sys.exit(main())
