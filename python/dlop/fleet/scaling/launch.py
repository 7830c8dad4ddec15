"""`dlop run --offloaders auto`: the fleet's store, its first offloaders, the controller,
then the training command as a child.

:func:`plan` checks the options (a bad one stops `dlop run` with a message
naming it) and :func:`run` carries them out:

1. a TCPStore for the fleet, hosted here (DLOP_RUN_STORE): the trainers read
   the offloaders there (DLOP_RUN_DISCOVER) and publish their figures there
   (DLOP_RUN_AUTOSCALE, dlop.fleet.scaling.figures);
2. the scaler's actuator and the first ``--min`` offloaders (local: started
   and listening before the command starts; slurm: submitted, and the trainers
   wait up to --wait seconds, default 120, for the first to be announced,
   DLOP_RUN_DISCOVER_WAIT);
3. the controller (dlop.fleet.scaling.controller), every ``--window`` seconds;
4. the command, as our child; when it exits the controller stops and the
   actuator stops what it started.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlop.fleet.scaling import policy


@dataclass(frozen=True)
class Plan:
    scaler: str
    settings: policy.Settings
    window: float
    advertise: str
    cores: int | None = None
    sbatch_args: tuple[str, ...] = ()
    deployment: str | None = None
    token_file: str | None = None
    dns: str = ""
    wait: float | None = None


def _default_scaler(env: dict[str, str]) -> str:
    if env.get("SLURM_JOB_ID"):
        return "slurm"
    if env.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    return "local"


def plan(p: argparse.ArgumentParser, args: argparse.Namespace, env: dict[str, str]) -> Plan:
    """The checked options of `dlop run --offloaders auto`; p.error names a bad one."""
    try:
        settings = policy.from_arguments(args)
    except ValueError as e:
        p.error(str(e))
    scaler = args.scaler or _default_scaler(env)
    if args.window <= 0:
        p.error(f"--window {args.window:g}: above 0 seconds")
    if args.discover or args.local_offloaders is not None:
        p.error("--offloaders auto finds its offloaders itself: it does not go with --discover or --local-offloaders")
    if args.offloaders_dns and scaler != "kubernetes":
        p.error("--offloaders-dns goes with --scaler kubernetes (the local and slurm fleets join through the store)")
    if scaler == "kubernetes" and not (args.deployment and args.offloaders_dns):
        p.error("--scaler kubernetes needs --deployment NAMESPACE/NAME and --offloaders-dns SERVICE:PORT "
                "(where the trainers find the Deployment's pods)")
    if args.deployment and scaler != "kubernetes":
        p.error("--deployment is for --scaler kubernetes")
    if args.sbatch_args and scaler != "slurm":
        p.error("--sbatch-args is for --scaler slurm")
    if args.cores is not None and (scaler != "local" or args.cores < 1):
        p.error(f"--cores {args.cores}: at least 1, and only for --scaler local")
    token_file = args.token_file or env.get("DLOP_OFFLOAD_TOKEN_FILE")
    if scaler == "local" and args.token_file:
        p.error("--token-file is for daemons started elsewhere: the local ones get a fresh token")
    if scaler == "slurm" and not token_file:
        p.error("--scaler slurm needs the job's token in a file every node reads: --token-file F "
                "(or DLOP_OFFLOAD_TOKEN_FILE)")
    if scaler == "kubernetes" and not (token_file or env.get("DLOP_OFFLOAD_TOKEN")):
        p.error("--scaler kubernetes needs the offloaders' token: --token-file F or DLOP_OFFLOAD_TOKEN")
    if token_file and scaler != "local":
        try:
            Path(token_file).read_bytes()
        except OSError as e:
            p.error(f"token file {token_file}: {e.strerror}")
    advertise = args.advertise or (socket.gethostname() if scaler == "slurm" else "127.0.0.1")
    return Plan(scaler=scaler, settings=settings, window=args.window, advertise=advertise, cores=args.cores,
                sbatch_args=tuple(shlex.split(args.sbatch_args)), deployment=args.deployment,
                token_file=str(Path(token_file).resolve()) if token_file and scaler != "local" else None,
                dns=args.offloaders_dns, wait=args.wait)


def _store(advertise: str):
    import datetime

    from torch.distributed import TCPStore

    host = "127.0.0.1" if advertise in ("127.0.0.1", "localhost") else "0.0.0.0"
    return TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))


def _actuator(plan: Plan, store: Any, store_address: str, command: list[str], env: dict[str, str]):
    if plan.scaler == "local":
        from dlop.fleet.local import default_count, token_folder
        from dlop.fleet.scaling.local import LocalActuator

        folder, token_file = token_folder()
        cores = plan.cores if plan.cores is not None else default_count(command, env)
        return LocalActuator(store, token_file, cores), folder, str(token_file)
    if plan.scaler == "slurm":
        from dlop.fleet import slurm
        from dlop.fleet.scaling.slurm import SlurmActuator

        floor = len(slurm.het_offloaders(env) or ())
        return SlurmActuator(store_address, Path(plan.token_file), sbatch_args=list(plan.sbatch_args), floor=floor,
                             env=env), None, plan.token_file
    from dlop.fleet.scaling.kubernetes import KubernetesActuator

    return KubernetesActuator.from_text(plan.deployment), None, plan.token_file


def run(command: list[str], env: dict[str, str], plan: Plan) -> int:
    from dlop.fleet.local import run_command
    from dlop.fleet.scaling.controller import Controller

    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    store = _store(plan.advertise)
    store_address = f"{plan.advertise}:{store.port}"
    folder = actuator = controller = None
    try:
        try:
            actuator, folder, token_file = _actuator(plan, store, store_address, command, env)
            controller = Controller(store, actuator, plan.settings, plan.window, say=say)
            first = max(plan.settings.min, actuator.floor)
            if actuator.size() < first:
                say(f"dlop run: {actuator.name} fleet: {actuator.scale(first)}")
        except (ValueError, RuntimeError) as e:
            raise SystemExit(f"dlop run: --offloaders auto: {e}") from None
        env = dict(env)
        env["DLOP_RUN_STORE"] = store_address
        env["DLOP_RUN_AUTOSCALE"] = store_address
        if plan.scaler == "kubernetes":
            env["DLOP_RUN_DNS"] = plan.dns
        else:
            env["DLOP_RUN_DISCOVER"] = "1"
        if plan.scaler == "slurm":  # its first offloader is a job that may still be starting
            env["DLOP_RUN_DISCOVER_WAIT"] = f"{120.0 if plan.wait is None else plan.wait:g}"
        elif plan.scaler == "kubernetes" and plan.wait:
            env["DLOP_RUN_WAIT"] = f"{plan.wait:g}"
        if token_file:
            env.pop("DLOP_OFFLOAD_TOKEN", None)
            env["DLOP_OFFLOAD_TOKEN_FILE"] = token_file
        if plan.scaler == "local":
            env["DLOP_RUN_OFFLOADERS"] = ",".join(actuator.addresses)
        s = plan.settings
        say(f"dlop run: offloaders sized from the data stall by {plan.scaler}, {s.min} to {controller.settings.max} "
            f"(stall target {s.stall_target:.0%} of the step), every {plan.window:g} s; the fleet's store is "
            f"{store_address}")
        if plan.scaler == "local" and plan.cores is None and controller.settings.max < s.max:
            say(f"dlop run: at most {controller.settings.max} local offloader(s): the command's ranks leave "
                f"{actuator.cores} core(s) of this machine spare; --cores N lets the fleet use N cores")
        controller.start()
        return run_command(command, env)
    finally:
        if controller is not None:
            controller.stop()
        if actuator is not None:
            actuator.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        del store
