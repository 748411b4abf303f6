"""The one layer that talks to the Kubernetes API (kubernetes-asyncio): typed reads and
conditional patches, the pod watch, conversions from API objects to `quorum.core` models."""
