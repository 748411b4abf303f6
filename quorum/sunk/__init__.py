"""The SUNK Pod Scheduler: Kubernetes pods placed by a real Slurm cluster (docs/sunk.md).

`model` decides (pure: validation, the placeholder job, who goes where, what to do about a job
that ended); `slurm` is the typed slurmrestd client; `hooks` is the API the Slurm prolog, epilog
and placeholder script call; `scheduler` is the reconciler that ties pods to jobs.
"""
