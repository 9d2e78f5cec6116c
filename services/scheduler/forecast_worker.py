"""The forecast pool's worker process (:mod:`.explainer`): it ends when its
parent does. A pool's worker holds both ends of its task queue, so it
would wait for tasks forever after a leader killed with SIGKILL; it checks
instead, every second, that its parent (the leader, or the forkserver that
ends with the leader) is still the one it started under."""

from __future__ import annotations

import os
import threading
import time

CHECK_S = 1.0


def orphan_guard() -> None:
    """The pool's initializer: end this process once its parent is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="orphan-guard", daemon=True).start()
