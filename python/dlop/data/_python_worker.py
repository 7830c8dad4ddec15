"""A dlop-offloader's Python worker: ``python -m dlop.data._python_worker FD``.

The daemon starts one per --threads for a connection that configured the
generic Python path and talks to it over the socket FD (little-endian):

  daemon -> worker   u64 n, the job (dlop.data._python_job.encode_job), once
  worker -> daemon   u8 0, u64 dataset length     | u8 1, u32 n, error text
  daemon -> worker   u64 seed, u64 epoch, u32 n, n x u64 indices, per batch
  worker -> daemon   u8 0, u32 samples, u64 n, blob | u8 1, u32 n, error text

The worker exits when the socket closes; the daemon kills it with its
connection.
"""
from __future__ import annotations

import os
import socket
import struct
import sys
import traceback


def _read(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        part = sock.recv(min(n - got, 1 << 20))
        if not part:
            raise EOFError
        chunks.append(part)
        got += len(part)
    return b"".join(chunks)


def _error(sock: socket.socket, text: str) -> None:
    data = text.encode("utf-8", "replace")[:4000]
    sock.sendall(struct.pack("<BI", 1, len(data)) + data)


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[1]))
    try:
        (n,) = struct.unpack("<Q", _read(sock, 8))
        blob = _read(sock, n)
    except EOFError:
        return 0
    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per worker, as torch's DataLoader workers
        import torch
        torch.set_num_threads(1)
        from dlop.data import _python_job as job
        from dlop.errors import SampleError
        # A torchvision built for another torch loads only through dlop's shim (as in the trainer);
        # imported only if the dataset needs it: it is half of a worker's start.
        from dlop._torchvision_compat import import_on_demand
        import_on_demand()
        dataset, collate_fn, skip = job.load_job(blob)
        size = len(dataset)
    except Exception as e:
        _error(sock, f"loading the dataset failed: {type(e).__name__}: {e}")
        return 1
    sock.sendall(struct.pack("<BQ", 0, size))
    while True:
        try:
            seed, epoch, count = struct.unpack("<QQI", _read(sock, 20))
            indices = struct.unpack(f"<{count}Q", _read(sock, 8 * count))
        except EOFError:
            return 0
        try:
            batch, skipped = job.make_batch(dataset, collate_fn, seed, epoch, indices, skip)
            # The skipped samples travel with the batch, so the trainer counts them.
            parts = job.encode_batch_parts((batch, skipped))
        except SampleError as e:  # it names the sample and why
            _error(sock, str(e))
            continue
        except Exception:
            _error(sock, "the collate_fn raised:\n" + traceback.format_exc(limit=8))
            continue
        sock.sendall(struct.pack("<BIQ", 0, count - len(skipped), sum(memoryview(p).nbytes for p in parts)))
        for p in parts:  # the tensors' memory goes to the socket as it is
            sock.sendall(p)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (BrokenPipeError, ConnectionResetError):
        sys.exit(0)  # the daemon closed the connection: nothing left to do
