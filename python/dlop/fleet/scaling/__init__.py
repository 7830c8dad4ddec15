"""Offloader fleets that size themselves: the trainers publish their data-loading
figures to the fleet's store, one controller decides the fleet's size with
the policy in dlop.fleet.scaling.policy, and an actuator (local processes, SLURM jobs, a
Kubernetes Deployment, Ray actors) starts or stops offloaders to match. See docs/offload.md,
"Sizing the fleet"."""
