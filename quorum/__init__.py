"""quorum: all-or-nothing gang admission and GPU-cloud admission policies for Kubernetes."""

from importlib import metadata

try:
    __version__ = metadata.version("quorum")
except metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.1.0"
