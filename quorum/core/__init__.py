"""Pure gang logic: models of nodes, pods and gangs, fit and planning.

No I/O here: no kopf, no kubernetes client, no aiohttp (tests/unit/test_layers.py enforces it),
so everything in this package is tested with plain data.
"""
