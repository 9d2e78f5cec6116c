"""Writing report lines for the node executor (Hops §3.2).

One :mod:`shared.jobreport` line per call, appended to ``HOPS_REPORT_FILE``
and flushed at once so the executor, which tails the file, sees it. A
report is never worth a training run: an unwritable file is warned about
once and the training goes on.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import BinaryIO

from shared.jobreport import AnyReport, encode_line

log = logging.getLogger("hops.plugin")


class Reporter:
    """Appends lines to ``path``; with ``path`` None (standalone, or a rank
    that is not its node's local rank 0) it drops them."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.written = 0
        self._file: BinaryIO | None = None
        self._warned = False

    def write(self, line: AnyReport) -> bool:
        """Append ``line``; False (after one warning) if it could not be."""
        if self.path is None:
            return False
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("ab")
            self._file.write(encode_line(line))
            self._file.flush()
        except OSError as exc:
            self._drop_file()
            if not self._warned:
                self._warned = True
                log.warning("cannot write the report file %s (%s); training goes on "
                            "without reports", self.path, exc)
            return False
        self.written += 1
        return True

    def _drop_file(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def close(self) -> None:
        self._drop_file()
