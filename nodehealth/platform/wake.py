"""A stop event a ``poll()`` can wait on: ``threading.Event`` plus a pipe that is readable once it is set.

The XID follower waits on ``/dev/kmsg`` with ``poll()``. With a plain ``threading.Event`` as its stop
signal it has to wake up every poll interval to look at the event (4 times a second, about a third of an
idle daemon's CPU); with this one it registers ``fileno()`` beside the log's descriptor and sleeps until
the kernel writes a record or someone calls ``set()``.

What it trusts: nothing from outside; the pipe is private to the process (``O_CLOEXEC``: a program the
daemon starts does not inherit it) and both ends are non-blocking, so ``set()`` never blocks, even from
a signal handler, and a full pipe is as good as a readable one. ``clear()`` drains it, so a cleared
event never leaves ``poll()`` spinning on a stale byte.
"""

from __future__ import annotations

import os
import threading


class WakeEvent(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self._r, self._w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def fileno(self) -> int:
        """The read end: readable (``POLLIN``) from the first ``set()`` until ``clear()``."""
        return self._r

    def set(self) -> None:
        super().set()
        try:
            os.write(self._w, b"x")
        except BlockingIOError:  # full: already readable
            pass
        except OSError:  # closed: nobody polls it any more
            pass

    def clear(self) -> None:
        super().clear()
        try:
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._r = self._w = -1

    def __del__(self) -> None:
        if getattr(self, "_w", -1) >= 0:
            self.close()
