"""quorum-operator: kopf (watching, indexing, events only) plus quorum's own scheduling loop."""
