"""The one shape of a coded refusal or failure raised inside a service:
a stable ``code`` (what a program matches on: an ack's or an error
record's code) and ``words`` (what a person reads), ``str()`` being
``<code>: <words>``. A refusal that goes on the wire carries the two as
they are (``CommandAck.code``/``error``, ``ErrorRecord``); a job's
failure reason is written ``<code>: <words>``."""

from __future__ import annotations


class CodedError(Exception):
    """A refusal or failure: ``code`` (stable) and ``words`` (why)."""

    def __init__(self, code: str, words: str) -> None:
        super().__init__(f"{code}: {words}")
        self.code = code
        self.words = words
