"""What quorum decided about a gang, as its Gang's status records it: typed and frozen, parsed
from the Gang and written back in this one place (`GangRecord.of`, each record's `to_json`).

A Gang is quorum's own object, but a person with access may edit it and an older version of
quorum may have written it: a record that is not an object, or lacks what identifies it, reads
as absent; a field of the wrong type reads as unset. Nothing here raises on what it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from quorum.core.times import timestamp

JSON = dict[str, Any]
T = TypeVar("T")

# The status fields that record decisions (what the operator acts on), by their JSON names.
DECISIONS = ("admission", "recovery", "disruption", "preemption", "preempted", "resized", "manualRelease")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _strs(value: object) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _objects(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _drop_none(record: JSON) -> JSON:
    return {k: v for k, v in record.items() if v is not None}


@dataclass(frozen=True, slots=True)
class Placement:
    pod: str
    uid: str
    node: str


@dataclass(frozen=True, slots=True)
class Admission:
    """A release (`status.admission`): its attempt (each decision of the gang numbered in
    order), when, and where each pod goes; a decision too large to record its placement has
    `pods`, how many it released, instead. The placement of a gang of thousands is parsed only
    when asked for (`placement`): a pass reads every gang's attempt."""

    attempt: int
    time: str | None = None
    entries: tuple[Any, ...] = ()  # the placement as recorded
    pods: int | None = None

    @classmethod
    def of(cls, raw: object) -> Admission | None:
        if not isinstance(raw, Mapping) or not raw:
            return None
        attempt = raw.get("attempt")
        if isinstance(attempt, str) and attempt.isdigit():
            attempt = int(attempt)
        entries = raw.get("placement")
        return cls(
            _int(attempt) or 0,
            _str(raw.get("time")),
            tuple(entries) if isinstance(entries, list) else (),
            _int(raw.get("pods")),
        )

    @classmethod
    def placing(cls, attempt: int, time: str, placement: tuple[Placement, ...]) -> Admission:
        entries = tuple({"pod": p.pod, "uid": p.uid, "node": p.node} for p in placement)
        return cls(attempt, time, entries)

    @property
    def placement(self) -> tuple[Placement, ...]:
        """Where each pod goes; entries without a uid and node (edited by hand) are skipped."""
        return tuple(
            Placement(str(e.get("pod") or ""), e["uid"], e["node"])
            for e in self.entries
            if isinstance(e, Mapping) and isinstance(e.get("uid"), str) and isinstance(e.get("node"), str)
        )

    @property
    def released_at(self) -> float:
        """When it was written, by the clock of the leader that wrote it (for people: timeouts
        count from when this process saw the decision)."""
        return timestamp(self.time)

    def merge_patch(self) -> JSON:
        """The record as a JSON merge patch that replaces it whole: a compact decision removes
        the placement of the one before it, and the other way round."""
        if self.pods is not None:
            return {"attempt": self.attempt, "time": self.time, "pods": self.pods, "placement": None}
        return {**self.to_json(), "pods": None}

    def to_json(self) -> JSON:
        if self.pods is not None:
            return _drop_none({"attempt": self.attempt, "time": self.time, "pods": self.pods})
        placement = [dict(e) for e in self.entries]
        return _drop_none({"attempt": self.attempt, "time": self.time, "placement": placement})


@dataclass(frozen=True, slots=True)
class Target:
    """A pod or Job a disruption deletes or suspends."""

    name: str  # "" in a compact record (a gang too large to name each pod: `compact`)
    uid: str

    def to_json(self) -> JSON:
        return {"name": self.name, "uid": self.uid} if self.name else {"uid": self.uid}


@dataclass(frozen=True, slots=True)
class Disruption:
    """What quorum is about to delete or suspend of the gang, and why (`status.disruption`),
    recorded before it acts and cleared once done and told."""

    reason: str
    attempt: int
    time: str | None = None
    message: str = ""
    pods: tuple[Target, ...] = ()
    jobs: tuple[Target, ...] = ()
    composite: str | None = None  # CompositePartiallyPlaced: the CompositePodGroup

    @classmethod
    def of(cls, raw: object) -> Disruption | None:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("reason"), str):
            return None

        def targets(value: object) -> tuple[Target, ...]:
            return tuple(
                Target(str(t.get("name") or ""), t["uid"])
                for t in _objects(value)
                if isinstance(t.get("uid"), str)
            )

        return cls(
            raw["reason"],
            _int(raw.get("attempt")) or 0,
            _str(raw.get("time")),
            _str(raw.get("message")) or "",
            targets(raw.get("pods")),
            targets(raw.get("jobs")),
            _str(raw.get("composite")),
        )

    def to_json(self) -> JSON:
        return _drop_none(
            {
                "reason": self.reason,
                "attempt": self.attempt,
                "time": self.time,
                "message": self.message,
                "pods": [t.to_json() for t in self.pods],
                "jobs": [t.to_json() for t in self.jobs],
                "composite": self.composite,
            }
        )

    def compact(self) -> Disruption:
        """The record without pod names (the uids say which pods): a gang of tens of thousands
        of pods is recorded within the 1.5 MiB etcd takes per object."""
        return replace(self, pods=tuple(Target("", t.uid) for t in self.pods))

    def still_recorded(self) -> JSON:
        """What the Gang holds while this is recorded and not done: the JSON Patch tests of a
        write made on it (paths under status)."""
        expect: JSON = {"admission/attempt": self.attempt, "disruption/reason": self.reason}
        if self.time is not None:
            expect["disruption/time"] = self.time
        return expect


@dataclass(frozen=True, slots=True)
class Recovery:
    """The last recovery (`status.recovery`): from a partial placement, with the failures in a
    row and the backoff, or from a member loss; and the Jobs quorum suspended and resumes."""

    reason: str | None = None
    attempt: int | None = None
    failures: int = 0
    time: str | None = None
    next_attempt_time: str | None = None
    message: str = ""
    suspended_jobs: tuple[str, ...] = ()
    # Found running at the last look: nothing was deleted, and the attempt may be recovered
    # again if it is still partially placed a timeout later.
    withdrawn: bool = False

    @classmethod
    def of(cls, raw: object) -> Recovery | None:
        if not isinstance(raw, Mapping) or not raw:
            return None
        return cls(
            _str(raw.get("reason")),
            _int(raw.get("attempt")),
            _int(raw.get("failures")) or 0,
            _str(raw.get("time")),
            _str(raw.get("nextAttemptTime")),
            _str(raw.get("message")) or "",
            _strs(raw.get("suspendedJobs")),
            raw.get("withdrawn") is True,
        )

    def recovered(self, attempt: int | None) -> bool:
        """Whether the admission `attempt` was recovered (not withdrawn)."""
        return attempt is not None and attempt == self.attempt and not self.withdrawn

    @property
    def backoff_until(self) -> float:
        """Epoch seconds before which the gang is not planned (0: no backoff)."""
        return timestamp(self.next_attempt_time)

    def merge_patch(self) -> JSON:
        """The record as a JSON merge patch that replaces it whole: unset fields as null."""
        return {
            "reason": self.reason,
            "attempt": self.attempt,
            "failures": self.failures,
            "time": self.time,
            "nextAttemptTime": self.next_attempt_time,
            "message": self.message,
            "suspendedJobs": list(self.suspended_jobs),
            "withdrawn": self.withdrawn or None,
        }

    def to_json(self) -> JSON:
        return _drop_none(self.merge_patch())


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    """A preemption in flight for the gang (`status.preemption`): the token its reservation
    taints carry, when and until when, and the work taken as the gang's tenant may read it."""

    token: str
    time: str | None = None
    deadline: str | None = None
    message: str = ""
    victims: tuple[Mapping[str, Any], ...] = ()
    nodes: tuple[str, ...] = ()  # written by earlier versions

    @classmethod
    def of(cls, raw: object) -> PreemptionRecord | None:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("token"), str) or not raw["token"]:
            return None
        return cls(
            raw["token"],
            _str(raw.get("time")),
            _str(raw.get("deadline")),
            _str(raw.get("message")) or "",
            tuple(dict(v) for v in _objects(raw.get("victims"))),
            _strs(raw.get("nodes")),
        )

    def to_json(self) -> JSON:
        record: JSON = {
            "token": self.token,
            "time": self.time,
            "deadline": self.deadline,
            "message": self.message,
            "victims": [dict(v) for v in self.victims],
        }
        if self.nodes:
            record["nodes"] = list(self.nodes)
        return _drop_none(record)


@dataclass(frozen=True, slots=True)
class Preempted:
    """The last time the gang was preempted (`status.preempted`)."""

    time: str | None = None
    message: str = ""
    by: str | None = None
    attempt: int | None = None  # the gang's decision it was taken under
    token: str | None = None  # the preemption's

    @classmethod
    def of(cls, raw: object) -> Preempted | None:
        if not isinstance(raw, Mapping) or not raw:
            return None
        return cls(
            _str(raw.get("time")),
            _str(raw.get("message")) or "",
            _str(raw.get("by")),
            _int(raw.get("attempt")),
            _str(raw.get("token")),
        )

    def under(self, admission: Admission | None) -> bool:
        """Taken under the gang's current decision (a record of an earlier version has only its
        time, compared as it always was)."""
        if self.attempt is not None:
            return self.attempt == (admission.attempt if admission else 0)
        since = admission.released_at if admission else 0.0
        return timestamp(self.time) >= since > 0

    def to_json(self) -> JSON:
        return _drop_none(self.merge_patch())

    def merge_patch(self) -> JSON:
        """The record as a JSON merge patch that replaces it whole (unset fields as null)."""
        return {
            "by": self.by,
            "time": self.time,
            "message": self.message,
            "attempt": self.attempt,
            "token": self.token,
        }


@dataclass(frozen=True, slots=True)
class Resized:
    """The last change of the gang's minMember (`status.resized`)."""

    old: int
    new: int
    time: str | None = None
    attempt: int | None = None  # the decision it was made under

    @classmethod
    def of(cls, raw: object) -> Resized | None:
        if not isinstance(raw, Mapping):
            return None
        old, new = _int(raw.get("from")), _int(raw.get("to"))
        if old is None or new is None:
            return None
        return cls(old, new, _str(raw.get("time")), _int(raw.get("attempt")))

    def to_json(self) -> JSON:
        return _drop_none({"from": self.old, "to": self.new, "time": self.time, "attempt": self.attempt})


@dataclass(frozen=True, slots=True)
class ManualRelease:
    """The last `quorum release` of the gang (`status.manualRelease`)."""

    time: str | None = None
    by: str = ""
    reason: str = ""
    pods: int = 0
    attempt: int | None = None  # quorum's decision it overrides

    @classmethod
    def of(cls, raw: object) -> ManualRelease | None:
        if not isinstance(raw, Mapping) or not raw:
            return None
        return cls(
            _str(raw.get("time")),
            _str(raw.get("by")) or "",
            _str(raw.get("reason")) or "",
            _int(raw.get("pods")) or 0,
            _int(raw.get("attempt")),
        )

    def overrides(self, admission: Admission | None) -> bool:
        """Whether it came after quorum's current decision: it names that attempt (or, a record
        of an earlier version, its time is not before the decision's)."""
        if admission is None:
            return False
        if self.attempt is not None:
            return self.attempt >= admission.attempt
        return timestamp(self.time) >= admission.released_at

    def to_json(self) -> JSON:
        return _drop_none(
            {
                "time": self.time,
                "by": self.by,
                "reason": self.reason,
                "pods": self.pods,
                "attempt": self.attempt,
            }
        )


class GangRecord:
    """Every decision a Gang records, each parsed when first read (a pass reads a few fields of
    every gang)."""

    __slots__ = ("_parsed", "_status")

    def __init__(self, status: Mapping[str, Any] | None = None) -> None:
        self._status: Mapping[str, Any] = status if isinstance(status, Mapping) else {}
        self._parsed: dict[str, Any] = {}

    @classmethod
    def of(cls, gang: Mapping[str, Any] | None) -> GangRecord:
        return cls((gang or {}).get("status"))

    def _field(self, name: str, parse: Callable[[object], T]) -> T:
        if name not in self._parsed:
            self._parsed[name] = parse(self._status.get(name))
        parsed: T = self._parsed[name]
        return parsed

    @property
    def admission(self) -> Admission | None:
        return self._field("admission", Admission.of)

    @property
    def recovery(self) -> Recovery | None:
        return self._field("recovery", Recovery.of)

    @property
    def disruption(self) -> Disruption | None:
        return self._field("disruption", Disruption.of)

    @property
    def preemption(self) -> PreemptionRecord | None:
        return self._field("preemption", PreemptionRecord.of)

    @property
    def preempted(self) -> Preempted | None:
        return self._field("preempted", Preempted.of)

    @property
    def resized(self) -> Resized | None:
        return self._field("resized", Resized.of)

    @property
    def manual_release(self) -> ManualRelease | None:
        return self._field("manualRelease", ManualRelease.of)

    @property
    def attempt(self) -> int:
        """The number of the gang's last decision (0: none)."""
        return self.admission.attempt if self.admission is not None else 0
