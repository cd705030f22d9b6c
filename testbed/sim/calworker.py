"""One operator of the live calibration chain: read a message, hash its chunks, pass it on.

Run as a single-threaded process (``python calworker.py ...``, the default) or as
a thread of the harness (:func:`serve`). Only the standard library is imported,
so the process starts fast and its one thread is all the cgroup holds.

A message is 12 bytes on a pipe: sequence number (uint32) and birth time
(float64, ``time.perf_counter``, CLOCK_MONOTONIC, comparable across processes).
Message ``seq`` costs ``chunks[seq]`` 64 KiB SHA-256 chunks, the same count the
simulated half is given. Per message the worker records when it read it, when
it finished, and the thread CPU time it spent; a trailer record (seq -1)
holds the thread's whole CPU time. Writes of <= PIPE_BUF bytes are
atomic, so messages never interleave.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import time
from array import array

CHUNK = 64 * 1024
PER_CALL = 64  # chunks per hashlib call: the GIL is released once per call
MESSAGE = struct.Struct("<Id")
RECORD_FIELDS = 4  # seq, read at, done at, thread CPU seconds
_BUFFER = memoryview(bytes(CHUNK * PER_CALL))


def burn_chunks(n: int) -> None:
    while n > 0:
        k = min(n, PER_CALL)
        hashlib.sha256(_BUFFER[: k * CHUNK]).digest()
        n -= k


def _read_exact(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = os.read(fd, size - len(data))
        if not part:
            return data
        data += part
    return data


def serve(fd_in: int, fd_out: int, chunks: array, ready_fd: int) -> array:
    """Serve messages from ``fd_in`` until it closes; return the records."""
    records = array("d")
    perf, cpu = time.perf_counter, time.thread_time
    cpu_start, delay_start = cpu(), _run_delay()
    os.write(ready_fd, b"r")
    while True:
        head = _read_exact(fd_in, MESSAGE.size)
        if len(head) < MESSAGE.size:
            break
        seq, _birth = MESSAGE.unpack(head)
        t_read, c0 = perf(), cpu()
        burn_chunks(chunks[seq])
        t_done, c1 = perf(), cpu()
        if fd_out >= 0:
            os.write(fd_out, head)
        records.extend((seq, t_read, t_done, c1 - c0))
    # Trailer: the thread's time waiting on a run queue (schedstat run_delay, throttled
    # time included) and all its CPU, reads and writes included.
    records.extend((-1.0, _run_delay() - delay_start, 0.0, cpu() - cpu_start))
    return records


def _run_delay() -> float:
    """Seconds this thread has waited on a run queue (0 without schedstats)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def main(argv: list[str]) -> int:
    chunks_path, records_path, ready_fd = argv[0], argv[1], int(argv[2])
    chunks = array("I")
    with open(chunks_path, "rb") as f:
        chunks.frombytes(f.read())
    records = serve(0, 1, chunks, ready_fd)
    with open(records_path, "wb") as f:
        records.tofile(f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
