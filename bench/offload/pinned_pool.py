"""The trainer's host CPU per batch delivered to a device, by where the lease pool lies, in one run on
the test accelerator `dlop_test` (whose pinned allocation waits for every device, as cudaHostAlloc does).

- `copy`: the pool is page-locked memory the device does not know; each batch is copied into torch's
  pinned memory (a fresh allocation) and uploaded from there, and its slot is released at the next
  step (what dlop.data did before the pool moved into the device's pinned memory).
- `slot`: the pool is the device's pinned memory (LeaseManager pin_for); each batch is uploaded from
  its slot, which is released once the upload's event has passed (dlop.data._device.Lent).

Both rows drive one LeaseManager each against the same local dlop-offloaders through
dlop.data._device.to_device, alternating, `--reps` epochs each. Per batch, from the second batch of
an epoch to its end: the trainer thread's CPU (time.thread_time), the process's CPU (the test
device's stream threads, which model the device's copies, included), the host's waits for the
device (dlop_test's count) and the wall time. Medians over the epochs, and slot/copy ratios.

    python -m bench.pinned_pool [--batch 32] [--size 224] [--images 640] [--reps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import secrets
import sys
import tempfile
import time
from pathlib import Path

from bench.common import _common
from bench.offload.offload_common import Daemons, offloader_path

ROWS = ("copy", "slot")


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _batches(m, epoch: int, lend: bool):
    """The loader's offloaded batches as dlop.data hands them to to_device (OffloadLoader._iter_offloaded)."""
    from dlop.data import _device

    m.restore({**m.state(), "epoch": epoch, "position": 0})
    held = None
    try:
        while True:
            if held is not None:
                m.release(held)
                held = None
            got = m.next()
            if got is None:
                return
            _, samples, labels, slot, _, _ = got
            if lend:
                yield _device.Lent((samples, labels), functools.partial(m.release, slot))
            else:
                held = slot
                yield samples, labels
    finally:
        if held is not None:
            m.release(held)


def _epoch(m, epoch: int, lend: bool, device) -> dict:
    import torch

    from dlop.data import _device
    from dlop.testing import accelerator

    it = _device.to_device(_batches(m, epoch, lend), device)
    next(it)  # the pipeline full, the daemons warm
    cpu0, thread0, waits0, wall0 = _process_cpu(), time.thread_time(), accelerator.host_waits(), time.perf_counter()
    n = 0
    for _ in it:
        n += 1
    wall, thread, cpu, waits = (time.perf_counter() - wall0, time.thread_time() - thread0, _process_cpu() - cpu0,
                                accelerator.host_waits() - waits0)
    torch.dlop_test.synchronize(device)
    return {"batches": n, "thread_cpu_ms": 1e3 * thread / n, "process_cpu_ms": 1e3 * cpu / n,
            "host_waits": waits / n, "wall_ms": 1e3 * wall / n}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=224, help="crop side: uint8 batches of batch x 3 x size x size")
    p.add_argument("--images", type=int, default=640, help="samples per epoch")
    p.add_argument("--reps", type=int, default=5, help="epochs per row")
    p.add_argument("--offloaders", type=int, default=2)
    p.add_argument("--copy-gbps", type=float, default=25.0, help="the test device's link")
    p.add_argument("--offloader", help="the dlop-offloader binary")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args(argv)

    import torch

    from dlop import _C
    from dlop.data.make_dataset import main as make_dataset
    from dlop.testing import accelerator

    device = torch.device(accelerator.NAME, 0)
    accelerator.configure(copy_gbps=a.copy_gbps)
    spec = json.dumps({"ops": [{"op": "random_resized_crop", "size": a.size}, {"op": "hflip", "p": 0.5}],
                       "output": "uint8"})
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="dlop-bench-pinned-") as tmp:
        data = Path(tmp) / "train"
        if make_dataset([str(data), "--classes", "4", "--per-class", str(-(-a.images // 4)), "--size", "320x240",
                         "--seed", "1"]) != 0:
            raise SystemExit("make-dataset failed")
        daemons = Daemons(offloader_path(a.offloader), a.offloaders, 1, None, token)
        try:
            managers = {}
            for row in ROWS:
                m = _C.offload.LeaseManager(str(data), spec, 0, a.batch, token, prefetch=4,
                                            pin_for=str(device) if row == "slot" else None)
                for address in daemons.addresses:
                    host, port = address.rsplit(":", 1)
                    m.add_daemon(host, int(port))
                managers[row] = m
            runs: dict[str, list[dict]] = {row: [] for row in ROWS}
            for rep in range(a.reps):
                for row in ROWS:
                    runs[row].append(_epoch(managers[row], rep, row == "slot", device))
        finally:
            daemons.close()

    keys = ("thread_cpu_ms", "process_cpu_ms", "host_waits", "wall_ms")
    rows = [{"row": row, "epochs": len(runs[row]), "batches_per_epoch": runs[row][0]["batches"],
             **{k: _common.median([r[k] for r in runs[row]]) for k in keys}} for row in ROWS]
    header = _common.run_header(batch=a.batch, size=a.size, images=a.images, copy_gbps=a.copy_gbps,
                                batch_bytes=a.batch * 3 * a.size * a.size)
    print(_common.header_comment(header))
    print(f"{'row':>5} {'trainer thread CPU ms/batch':>28} {'process CPU ms/batch':>21} {'host waits/batch':>17} "
          f"{'wall ms/batch':>14}")
    for r in rows:
        print(f"{r['row']:>5} {r['thread_cpu_ms']:>28.3f} {r['process_cpu_ms']:>21.3f} {r['host_waits']:>17.2f} "
              f"{r['wall_ms']:>14.2f}")
    before, after = rows
    for k in ("thread_cpu_ms", "process_cpu_ms", "host_waits"):
        ratio = after[k] / before[k] if before[k] > 0 else float("nan")
        print(f"# slot/copy {k}: {ratio:.3f}")
    if a.json:
        _common.write_json(a.json, header, rows)
        print(f"# written to {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
