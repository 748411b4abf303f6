"""Times as the Kubernetes API writes them (RFC 3339, whole seconds; microseconds for a Lease)
and back to epoch seconds."""

from __future__ import annotations

import datetime
import math


def timestamp(value: object) -> float:
    """Epoch seconds of an RFC 3339 time as the API writes it; 0 for none or garbage."""
    if not value or not isinstance(value, str):
        return 0.0
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def iso(epoch: float) -> str:
    """RFC 3339 in whole seconds (as the API writes times)."""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(epoch: float) -> str:
    """RFC 3339 with microseconds (a Lease's MicroTime)."""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def iso_deadline(epoch: float) -> str:
    """A deadline in whole seconds, rounded up: never earlier than meant."""
    return iso(math.ceil(epoch))
