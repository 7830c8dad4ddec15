"""dlop.fleet: the offloader daemons a job uses, and how many.

- ``run``: ``dlop run``, the job launcher; its ``_run_site`` sitecustomize
  hands the trainers' DataLoaders to dlop.data.run_loaders.
- ``launcher``: ``dlop offloader``, a daemon started for a job; ``local``:
  daemons on the trainers' own host; ``slurm``: what a SLURM job's
  environment says, ``slurm_template``: its batch script.
- ``discovery``: offloaders announced in the job's c10d store; ``dns``:
  offloaders known by name, or not listening yet.
- ``stats``: ``dlop offloader-stats``, a daemon's counters.
- ``scaling``: fleets that size themselves: the policy, the controller, and
  the local, SLURM and Kubernetes actuators.
"""


def __getattr__(name: str):
    # dlop.fleet was the module dlop.fleet.dns is now: its names still resolve here, with a warning.
    from dlop import _moved

    return _moved.moved_name(__name__, name)
