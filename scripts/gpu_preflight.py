#!/usr/bin/env python3
"""What a GPU script needs of the machine, checked in seconds before any build or row.

    scripts/gpu_preflight.py --device cuda --need torch,cv2,matplotlib,shm,nvidia-smi [--json FILE]

One line per item, "ok" or "MISSING" with what was found, then "preflight: ok" or
"preflight: missing A, B" (exit 1) naming every missing item at once, so one
command on the lent machine says all that must be carried or changed. Items
not in --need are checked and shown, never fatal:

- torch: imports; on cuda, CUDA is available (the device count and name), on
  dlop_test the test accelerator loads;
- cv2, matplotlib, torchvision, cloudpickle, tqdm: import (the stock video rows
  read clips with OpenCV where PyAV is missing, as on the lent GPU machine; the
  reports plot with matplotlib); video_reader: PyAV or OpenCV imports;
- shm: /dev/shm holds at least --shm-min-mib (a container's default 64 MiB
  fails the offloaders' and UCX's shared memory);
- ptrace: one process takes a file descriptor of a sibling (pidfd_getfd), as
  torch's CUDA IPC does for memory of expandable segments
  (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) between DDP ranks;
- nvidia-smi: answers with the GPUs;
- cores: at least --min-cores usable cores; disk: --disk-min-mib free where the build goes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

# The quick ones first: where the 15 s run out (a hung import or driver), the last line printed says where.
ITEMS = ("shm", "cores", "disk", "nvidia-smi", "ptrace", "cloudpickle", "tqdm", "matplotlib", "cv2", "video_reader",
         "torch", "torchvision")
# Keeps a descriptor open and says its number; the sibling below takes it through pidfd_getfd.
_HOLDER = "import os, sys; print(os.open('/dev/null', os.O_RDONLY), flush=True); sys.stdin.read()"
_TAKER = """
import ctypes, os, sys
pid, fd = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
pidfd = os.pidfd_open(pid)
got = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd: 438 on x86-64 and arm64
if got < 0:
    raise SystemExit(os.strerror(ctypes.get_errno()))
"""


def check_torch(device: str) -> str:
    import torch
    import torch.distributed

    text = f"torch {torch.__version__}"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"{text}: CUDA is not available (torch.version.cuda {torch.version.cuda})")
        names = {torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else "none"
        return (f"{text}, CUDA {torch.version.cuda}, NCCL {nccl}, {torch.cuda.device_count()} device(s): "
                f"{', '.join(sorted(names))}")
    if device == "dlop_test":
        import dlop.testing.accelerator  # noqa: F401

        return f"{text}, dlop_test with {torch.dlop_test.device_count()} device(s)"
    return text


def check_import(name: str) -> str:
    module = __import__(name)
    return f"{name} {getattr(module, '__version__', '')}".strip()


def check_video_reader() -> str:
    found = []
    for name in ("av", "cv2"):
        try:
            found.append(check_import(name))
        except Exception:
            pass
    if not found:
        raise RuntimeError("neither PyAV (av) nor OpenCV (cv2) imports: the stock video rows cannot read clips")
    return ", ".join(found)


def check_shm(min_mib: int) -> str:
    st = os.statvfs("/dev/shm")
    size, free = st.f_blocks * st.f_frsize >> 20, st.f_bavail * st.f_frsize >> 20
    text = f"/dev/shm {size} MiB, {free} MiB free"
    if free < min_mib:
        raise RuntimeError(f"{text}; needs {min_mib} MiB free (docker run --shm-size, or mount -o remount,size=)")
    return text


def check_ptrace() -> str:
    if not hasattr(os, "pidfd_open"):
        raise RuntimeError("os.pidfd_open is missing (Python 3.9+ on Linux 5.3+)")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        fd = holder.stdout.readline().strip()
        taker = subprocess.run([sys.executable, "-c", _TAKER, str(holder.pid), fd], capture_output=True, text=True,
                               timeout=5)
    finally:
        holder.stdin.close()
        holder.wait(timeout=5)
    scope = "unknown"
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        pass
    if taker.returncode != 0:
        why = (taker.stderr.strip().splitlines() or ["failed"])[-1]
        raise RuntimeError(f"pidfd_getfd of a sibling: {why} (yama ptrace_scope {scope}; CUDA IPC of expandable "
                           "segments needs it: run as root, or with CAP_SYS_PTRACE, or ptrace_scope 0)")
    return f"pidfd_getfd of a sibling works (yama ptrace_scope {scope})"


def check_nvidia_smi() -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise RuntimeError("not on the PATH")
    out = subprocess.run([exe, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=8)
    if out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError(f"exited {out.returncode}: {(out.stderr or out.stdout).strip()[:200]}")
    return "; ".join(line.strip() for line in out.stdout.splitlines() if line.strip())


def check_cores(minimum: int) -> str:
    n = len(os.sched_getaffinity(0))
    if n < minimum:
        raise RuntimeError(f"{n} usable cores; needs {minimum}")
    return f"{n} usable cores"


def check_disk(minimum: int) -> str:
    free = shutil.disk_usage(".").free >> 20
    if free < minimum:
        raise RuntimeError(f"{free} MiB free here; needs {minimum}")
    return f"{free} MiB free here"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda, dlop_test or cpu")
    p.add_argument("--need", default="", help="comma-separated items that must pass: " + ", ".join(ITEMS))
    p.add_argument("--shm-min-mib", type=int, default=1024)
    p.add_argument("--min-cores", type=int, default=2)
    p.add_argument("--disk-min-mib", type=int, default=2048)
    p.add_argument("--json", help="write {item: {ok, text, needed}} here")
    args = p.parse_args(argv)
    need = {n.strip() for n in args.need.split(",") if n.strip()}
    if unknown := need - set(ITEMS):
        p.error(f"--need: unknown {', '.join(sorted(unknown))}; choose from {', '.join(ITEMS)}")
    checks = {"torch": lambda: check_torch(args.device), "shm": lambda: check_shm(args.shm_min_mib),
              "ptrace": check_ptrace, "video_reader": check_video_reader, "nvidia-smi": check_nvidia_smi,
              "cores": lambda: check_cores(args.min_cores), "disk": lambda: check_disk(args.disk_min_mib)}
    results, missing = {}, []
    for item in ITEMS:
        try:
            ok, text = True, checks.get(item, lambda i=item: check_import(i))()
        except Exception as e:  # any failure is the item missing; the text says which
            ok, text = False, f"{type(e).__name__}: {e}" if not isinstance(e, RuntimeError) else str(e)
        results[item] = {"ok": ok, "text": text, "needed": item in need}
        mark = "ok     " if ok else ("MISSING" if item in need else "absent ")
        print(f"{mark} {item}: {text}", flush=True)
        if not ok and item in need:
            missing.append(item)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "items": results, "missing": missing}, f, indent=2)
    print("preflight: " + (f"missing {', '.join(missing)}" if missing else "ok"), flush=True)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
