"""The operator's one Events recorder (like client-go's EventRecorder, injected everywhere): every
Event quorum-operator posts goes through `EventRecorder.post`, and the rules of when one is
posted at all live here.

- An Event is best effort: one the apiserver refuses is logged and fails nothing, except where
  the caller says it must be told (`required=True`: a deletion's Event, which must follow the
  act; the caller's task fails and is retried, its record still in place).
- A failure of quorum's own work on a gang is told at its 1st, 2nd, 4th, 8th ... time in a row,
  not at every retry.
- An Event names its object: a Gang, a group object or a pod (`pod_object` for a pod known only
  from the watch).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from quorum.k8s.api import KubeApi
from quorum.operator.gangs import JSON

log = logging.getLogger("quorum.operator")


def pod_object(pod: JSON) -> JSON:
    return {"apiVersion": "v1", "kind": "Pod", **pod}


def worth_telling(count: int) -> bool:
    """A failure repeated `count` times in a row is told at the 1st, 2nd, 4th, 8th ... time."""
    return count > 0 and not count & (count - 1)


class EventRecorder:
    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def post(
        self, obj: JSON | None, reason: str, message: str, warning: bool = False, required: bool = False
    ) -> None:
        if obj is None:
            return
        try:
            await self.api.post_event(obj, reason, message, warning=warning)
        except Exception:
            if required:
                raise
            meta = obj.get("metadata") or {}
            log.warning("Event %s on %s/%s not posted", reason, meta.get("namespace"), meta.get("name"))

    async def post_all(
        self,
        objs: Sequence[JSON | None],
        reason: str,
        message: str,
        warning: bool = False,
        required: bool = False,
    ) -> None:
        """The same Event on each object (a Gang and its group object, say)."""
        await asyncio.gather(
            *(self.post(o, reason, message, warning, required) for o in objs if o is not None)
        )
