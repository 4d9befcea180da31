"""How a process that ran gloo ranks ends: :func:`leave_rank`.

``dist.destroy_process_group()`` does not stop gloo's threads: after it (and a garbage
collection) a rank still runs ``pt_gloo_runloop`` (ProcessGroupGloo's workers),
``gloo_tcp_loop`` (gloo's transport) and, on the rank that hosts it, ``pt_tcpstore_uv``
(the TCPStore server), held by C++ objects that Python no longer reaches. A normal exit
then finalizes the interpreter and runs C++ static destructors, which tear those owners
down in no fixed order while their threads run; now and then a ``std::thread`` is
destroyed still joinable and the process dies in ``std::terminate`` ("terminate called
without an active exception", SIGABRT) after all its work succeeded. A rank that has
written and closed every result leaves with ``os._exit`` instead, which runs no destructor.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import torch.distributed as dist


def leave_rank() -> NoReturn:
    """Destroy the process groups (if any), flush, and end the process with status 0."""
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
