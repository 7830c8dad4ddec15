"""dlop run: an unmodified training script, its DataLoaders' work offloaded.

    dlop run [--local-offloaders N] -- python train.py ARGS...
    dlop run --offloaders HOST:PORT[,...] [--token-file F] -- python train.py ARGS...
    dlop run --offloaders-dns NAME:PORT[,...] [--token-file F] -- python train.py ARGS...
    dlop run --discover [--token-file F] -- torchrun --nproc-per-node 2 train.py ARGS...
    dlop run --offloaders auto [--scaler local|slurm|kubernetes] [--min N --max N ...] -- python train.py ARGS...
    srun --het-group=0 dlop run -- python train.py ARGS...   # in a SLURM het job: no flags

In a SLURM heterogeneous job whose het group 1 runs `dlop offloader`, and
given none of the flags that name offloaders, `dlop run` uses those
offloaders (dlop.fleet.slurm.het_offloaders: group 1's nodes, a port derived from
the job id) with the job's token (DLOP_OFFLOAD_TOKEN_FILE, which the batch
script makes: see `dlop slurm-template`), waiting up to --wait seconds
(default 120 there) for the first to answer; the others join as they do.
Under srun it also sets torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT from srun's variables where they are unset.

--offloaders-dns takes every address behind each name (A and AAAA records,
see dlop.fleet), re-resolved every 10 s so that new addresses join.

With none of those and without --discover, `dlop run` starts dlop-offloader
daemons on this host (one per core the command's ranks leave spare, at least
one; --local-offloaders N to choose) with a fresh token, runs the command as
its child (forwarding SIGINT, SIGTERM and SIGHUP to it, those not ignored on entry), stops the daemons
when it exits and exits with its status; see dlop.fleet.local for how
they also go when `dlop run` is killed. It prints their addresses and token
file (for `dlop offloader-stats`); --offloader-threads N,
--offloader-metrics-port PORT (Prometheus, PORT + k for daemon k) and
--offloader-arg ARG (repeatable) pass options to each. Otherwise the command replaces this
process (exec: signals and the exit status are the command's).

``--offloaders auto`` sizes the fleet from the trainers' data stall
(dlop.fleet.scaling): `dlop run` hosts a c10d store for the fleet, every rank
publishes its loader's figures there, and a controller in `dlop run` decides
the fleet's size every --window seconds (the policy in dlop.fleet.scaling.policy, its
options --min, --max, --stall-target, --busy-threshold, --headroom,
--hysteresis, --cooldown-steps) and has the scaler carry it out: ``local``
starts and stops daemons on this host within --cores (default: the cores the
command's ranks leave spare), ``slurm`` submits offloader jobs with sbatch
(--sbatch-args) and cancels them with scancel, ``kubernetes`` scales
--deployment NAMESPACE/NAME. New offloaders join through the store (local,
slurm) or --offloaders-dns (kubernetes). The default scaler is slurm inside a
SLURM job, kubernetes inside a pod, local elsewhere.

dlop's ``sitecustomize`` (python/dlop/fleet/_run_site) goes first on
PYTHONPATH, so every Python the command starts, torchrun's ranks included,
loads it; it patches ``torch.utils.data.DataLoader.__iter__`` once torch's
data module is imported, and costs nothing elsewhere. Iterating a DataLoader
then runs ``dlop.data.offload(loader)`` once for that loader (dlop.data.run_loaders)
and yields its batches: the same dataset, transforms and batch size, made by
the offloaders in dlop's seeded order (sharded across the job's ranks like a
DistributedSampler, whose ``set_epoch`` keeps working). A loader that cannot
be offloaded, or finds no offloader serving it, runs as torch's after one
warning naming why; with ``--strict`` its iteration raises instead, naming
why, so the job fails rather than train on local workers unnoticed. Each
process that iterated a DataLoader prints one line at exit counting the
batches the offloaders made, those made locally and those torch made.

``--discover`` takes the offloaders announced in the job's c10d store (see
``dlop.fleet.discovery`` and ``dlop offloader --store``), also those that join
later: the default process group's store, so the script must have called
``init_process_group`` before iterating; ``--store HOST:PORT`` names a store
instead. Settings travel by environment: DLOP_RUN_OFFLOADERS, DLOP_RUN_DNS,
DLOP_RUN_WAIT, DLOP_RUN_DISCOVER, DLOP_RUN_STORE, DLOP_RUN_STRICT, DLOP_OFFLOAD_TOKEN_FILE (or
the token in DLOP_OFFLOAD_TOKEN). ``python -S`` / ``-I`` skip sitecustomize, and with it dlop.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

SITE_DIR = Path(__file__).resolve().parent / "_run_site"


# ---------------------------------------------------------------- the launcher


def _check_address(text: str, what: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"dlop run: {what} {text!r} is not HOST:PORT")
    return text


def environment(argv: list[str], base: dict[str, str]) -> tuple[list[str], dict[str, str], Any]:
    """(command, its environment, the local offloaders to start (dlop.fleet.local.LocalDaemons),
    or with --offloaders auto a dlop.fleet.scaling.launch.Plan, or None) for `dlop run ARGV`.

    With local offloaders or a plan the environment lacks DLOP_RUN_OFFLOADERS
    and the token, which :func:`main` adds once the daemons listen."""
    from dlop.fleet import slurm
    from dlop.fleet.scaling import policy
    from dlop.fleet.dns import split_host_port

    own, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, None)
    p = argparse.ArgumentParser(prog="dlop run", usage="dlop run [--local-offloaders N | --offloaders HOST:PORT[,...] "
                                "| --offloaders-dns NAME:PORT[,...] | --discover] [--token-file F] [--strict] "
                                "[--store HOST:PORT] [--wait S] -- COMMAND [ARGS...]",
                                description="Run a training command with its DataLoaders offloaded to dlop-offloader "
                                            "daemons (those of a SLURM het job's group 1, or started on this host, "
                                            "unless named).")
    p.add_argument("--offloaders", default="", help="comma-separated HOST:PORT of dlop-offloader daemons, or auto: "
                                                    "a fleet sized from the trainers' data stall")
    p.add_argument("--offloaders-dns", default="", metavar="NAME:PORT[,...]",
                   help="every address behind each name (A and AAAA records), e.g. a Kubernetes headless Service")
    p.add_argument("--discover", action="store_true", help="also use the offloaders announced in the job's c10d store")
    p.add_argument("--store", help="with --discover: this TCPStore instead of the default process group's")
    p.add_argument("--token-file", help="the offloaders' shared token (default: DLOP_OFFLOAD_TOKEN)")
    p.add_argument("--strict", action="store_true",
                   help="a DataLoader that is not offloaded (no offloader serves it, or dlop cannot reproduce it) "
                        "raises instead of running as torch's after a warning")
    p.add_argument("--wait", type=float, metavar="S",
                   help="seconds to wait for the first offloader to answer (default: 120 in a SLURM het job, else 0)")
    p.add_argument("--local-offloaders", type=int, metavar="N",
                   help="start N dlop-offloader daemons on this host for the command's lifetime (the default "
                        "without offloaders named or a SLURM het job: one per core the command's ranks leave spare)")
    daemons = p.add_argument_group("the local offloaders")
    daemons.add_argument("--offloader-threads", type=int, metavar="N",
                         help="compute threads of each local dlop-offloader (default 1)")
    daemons.add_argument("--offloader-metrics-port", type=int, metavar="PORT",
                         help="each local dlop-offloader serves Prometheus metrics at /metrics: the first on PORT, "
                              "the next on PORT+1, ... (0: any free port); printed at start (default: none)")
    daemons.add_argument("--offloader-arg", action="append", default=[], metavar="ARG",
                         help="pass ARG to each local dlop-offloader as it is, e.g. --offloader-arg=--no-python "
                              "(repeatable; dlop-offloader --help lists them)")
    scaling = p.add_argument_group("--offloaders auto")
    scaling.add_argument("--scaler", choices=("local", "slurm", "kubernetes"),
                         help="who starts and stops offloaders (default: slurm in a SLURM job, kubernetes in a pod, "
                              "local elsewhere)")
    scaling.add_argument("--window", type=float, default=2.0, help="seconds between decisions (default 2)")
    scaling.add_argument("--cores", type=int, help="local: cores the offloaders may use (default: those the "
                                                    "command's ranks leave spare)")
    scaling.add_argument("--sbatch-args", default="", help="slurm: arguments for each offloader job's sbatch, e.g. "
                                                           "\"--partition cpu --cpus-per-task 8\"")
    scaling.add_argument("--deployment", help="kubernetes: the offloaders' Deployment, NAMESPACE/NAME")
    scaling.add_argument("--advertise", help="the host the trainers and offloaders reach the fleet's store at "
                                             "(default: 127.0.0.1, or this host's name for slurm)")
    policy.add_arguments(scaling)
    args, stray = p.parse_known_args(own)
    if command is None and stray:
        p.error(f"unrecognized arguments: {' '.join(stray)}; the command goes after --: "
                f"dlop run [OPTIONS] -- {' '.join(stray)}")
    if stray:
        p.error(f"unrecognized arguments: {' '.join(stray)}")
    if not command:
        p.error("no command: put it after --, e.g. dlop run -- python train.py")
    auto = args.offloaders.strip() == "auto"
    addresses = [] if auto else [_check_address(a.strip(), "offloader address")
                                 for a in args.offloaders.split(",") if a.strip()]
    names = [a.strip() for a in args.offloaders_dns.split(",") if a.strip()]
    for name in names:
        try:
            split_host_port(name)
        except ValueError as e:
            p.error(f"--offloaders-dns {e}")
    if args.store and not args.discover:
        p.error("--store only means something with --discover")
    if args.wait is not None and args.wait < 0:
        p.error(f"--wait {args.wait:g}: not negative")
    env = dict(base)
    for name in ("DLOP_RUN_DISCOVER", "DLOP_RUN_STORE", "DLOP_RUN_DNS", "DLOP_RUN_WAIT", "DLOP_RUN_AUTOSCALE",
                 "DLOP_RUN_DISCOVER_WAIT", "DLOP_RUN_STRICT"):
        env.pop(name, None)
    if args.strict:
        env["DLOP_RUN_STRICT"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR)] + [q for q in env.get("PYTHONPATH", "").split(os.pathsep) if q])
    if auto:
        _refuse_daemon_options(p, args)
        from dlop.fleet.scaling import launch

        if "SLURM_STEP_ID" in env:
            env.update(slurm.torch_env(env))
        return command, env, launch.plan(p, args, env)
    try:
        if "SLURM_STEP_ID" in env:  # under srun: torchrun's variables, as dlop.init() maps them
            env.update(slurm.torch_env(env))
        het = None
        if not (addresses or names or args.discover or args.local_offloaders is not None):
            het = slurm.het_offloaders(env)
    except ValueError as e:
        raise SystemExit(f"dlop run: {e}") from None
    wait = args.wait
    if het:
        addresses, wait = het, 120.0 if wait is None else wait
        print(f"dlop run on {socket.gethostname()}: SLURM job {env.get('SLURM_JOB_ID')}: the offloaders of het group "
              f"{slurm.OFFLOADER_GROUP}: {', '.join(het)}", file=sys.stderr, flush=True)
    if not addresses and not names and not args.discover:
        from dlop.fleet.local import default_count

        if args.token_file:
            p.error("--token-file is for daemons started elsewhere: the local ones get a fresh token")
        if args.wait is not None:
            p.error("--wait is for daemons started elsewhere: dlop run waits for the local ones itself")
        count = default_count(command, env) if args.local_offloaders is None else args.local_offloaders
        if count < 1:
            p.error(f"--local-offloaders {count}: at least 1")
        return command, env, _local_daemons(p, args, count)
    _refuse_daemon_options(p, args)
    if args.local_offloaders is not None:
        p.error("--local-offloaders starts daemons here: it does not go with --offloaders, --offloaders-dns "
                "or --discover")
    env["DLOP_RUN_OFFLOADERS"] = ",".join(addresses)
    if names:
        env["DLOP_RUN_DNS"] = ",".join(names)
    if wait:
        env["DLOP_RUN_WAIT"] = f"{wait:g}"
    if args.discover:
        env["DLOP_RUN_DISCOVER"] = "1"
    if args.store:
        env["DLOP_RUN_STORE"] = _check_address(args.store, "--store")
    token_file = args.token_file or env.get("DLOP_OFFLOAD_TOKEN_FILE")
    if token_file:
        path = Path(token_file).resolve()
        try:
            path.read_bytes()
        except OSError as e:
            raise SystemExit(f"dlop run: token file {token_file}: {e.strerror}") from None
        env["DLOP_OFFLOAD_TOKEN_FILE"] = str(path)  # the path, not the secret, goes in the environment
    elif not env.get("DLOP_OFFLOAD_TOKEN"):
        where = " (the batch script makes the job's: see dlop slurm-template)" if het else ""
        raise SystemExit(f"dlop run: no token: pass --token-file or set DLOP_OFFLOAD_TOKEN{where}")
    return command, env, None


def _refuse_daemon_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    given = [f for f, v in (("--offloader-threads", args.offloader_threads), ("--offloader-arg", args.offloader_arg),
                            ("--offloader-metrics-port", args.offloader_metrics_port)) if v not in (None, [])]
    if given:
        p.error(f"{given[0]} is for the daemons dlop run starts here: it does not go with --offloaders, "
                "--offloaders-dns or --discover")


def _local_daemons(p: argparse.ArgumentParser, args: argparse.Namespace, count: int):
    from dlop.fleet.local import LocalDaemons

    threads = 1 if args.offloader_threads is None else args.offloader_threads
    if threads < 1:
        p.error(f"--offloader-threads {threads}: at least 1")
    port = args.offloader_metrics_port
    if port is not None and not (port == 0 or 0 < port and port + count - 1 <= 65535):
        p.error(f"--offloader-metrics-port {port}: ports {port} to {port + count - 1} for {count} daemon(s) are not "
                "all ports (1-65535; 0 for any free port)")
    return LocalDaemons(count, threads, port, tuple(args.offloader_arg))


def _run_with_local_offloaders(command: list[str], env: dict[str, str], plan) -> int:
    from dlop.fleet.local import LocalOffloaders, run_command

    with LocalOffloaders(plan) as daemons:
        print(daemons.describe(), file=sys.stderr, flush=True)
        env = {k: v for k, v in env.items() if k != "DLOP_OFFLOAD_TOKEN"}
        env["DLOP_RUN_OFFLOADERS"] = ",".join(daemons.addresses)
        env["DLOP_OFFLOAD_TOKEN_FILE"] = str(daemons.token_file)
        return run_command(command, env)


def main(argv: list[str] | None = None) -> int:
    command, env, local = environment(sys.argv[1:] if argv is None else argv, dict(os.environ))
    if shutil.which(command[0], path=env.get("PATH")) is None:
        raise SystemExit(f"dlop run: command not found: {command[0]}")
    from dlop.fleet.local import LocalDaemons

    if isinstance(local, LocalDaemons):
        return _run_with_local_offloaders(command, env, local)
    if local is not None:
        from dlop.fleet.scaling import launch

        return launch.run(command, env, local)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], command, env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
