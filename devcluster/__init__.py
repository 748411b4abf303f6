"""The local control plane (etcd, Kubernetes 1.37 or 1.36, kwok) used by the demo, tests and benchmarks.

Built from Go modules with the machine's Go toolchain; no Docker. See `build`, `cluster`.
"""
