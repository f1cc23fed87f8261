"""A draft step on a thread of its own while the serving loop reads its socket (the draft server's
`read_while_stepping`): a message that comes during a step is taken off the socket, decoded and queued then, and
served the moment the step ends; the loop wakes at the step's end through a pipe polled beside the socket."""
from __future__ import annotations

import collections
import os
import time
from concurrent.futures import ThreadPoolExecutor, wait

import zmq


class Overlap:
    """A draft step on a thread of its own while the serving loop takes messages off the socket (transport's take:
    read, decoded and queued, served once the step ends), so that a Commits that comes during a step is read then,
    not after it. The loop wakes the moment the step ends (a pipe beside the socket in one poll). Until start()
    (no transport pump), run() steps inline. device: the step thread's CUDA device (None on a CPU)."""

    def __init__(self, device=None):
        self.device, self.take, self.pool, self.wake, self.poller = device, None, None, None, None
        self.read = 0                  # messages taken while a step ran
        self.spans: collections.deque = collections.deque(maxlen=256)   # (step start, step end), wall clock

    def _bind(self) -> None:
        if self.device is not None:
            import torch
            torch.cuda.set_device(self.device)

    def start(self, take) -> None:
        """take(timeout_ms) -> messages taken; take.sock: the socket it reads."""
        self.take, self.pool = take, ThreadPoolExecutor(1, thread_name_prefix="draft-step", initializer=self._bind)
        self.wake = os.pipe()
        os.set_blocking(self.wake[0], False)
        self.poller = zmq.Poller()
        self.poller.register(take.sock, zmq.POLLIN)
        self.poller.register(self.wake[0], zmq.POLLIN)

    def run(self, fn, *args):
        """fn(*args) (a draft step), its errors raised here as if it ran inline. The step writes one wake byte as it
        ends (before its future is done), and the loop ends on reading it, so none is left for the next step's
        poll; if the reading fails, the step is waited for (and its byte read) before the error goes on."""
        if self.take is None:
            t0 = time.time()
            try:
                return fn(*args)
            finally:
                self.spans.append((t0, time.time()))

        def step():
            try:
                return fn(*args)
            finally:
                os.write(self.wake[1], b".")
        t0 = time.time()
        fut = self.pool.submit(step)
        try:
            while True:
                ready = dict(self.poller.poll())       # the socket or the step's end, whichever first
                if self.take.sock in ready:
                    self.read += self.take(0)
                if self.wake[0] in ready and self._woken():
                    break
        except BaseException:
            wait([fut])
            self._woken()
            raise
        self.spans.append((t0, time.time()))
        return fut.result()

    def _woken(self) -> bool:
        try:
            return bool(os.read(self.wake[0], 64))
        except BlockingIOError:
            return False

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            for fd in self.wake:
                os.close(fd)
        self.take = self.pool = self.wake = self.poller = None
