"""How the bench's processes end: output flushed, logging shut down, and no interpreter teardown,
where the Temporal SDK's native runtime can abort (a known problem of the Python SDK) and turn a
finished run into a crash code. Standard library only: the measured subprocesses import it."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn


def hard_exit(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(Exception):
        logging.shutdown()
    os._exit(code)
