"""CKS: label keys in the platform's domains (`*.coreweave.cloud`, `*.coreweave.com`) are the
platform's. Adding one, changing its value or removing it is denied to everyone but the platform
identities — on Pods, Nodes, Namespaces and the pod templates of workloads (seed 002).

Matching is on DNS-label boundaries: `foo.coreweave.cloud/x` and `coreweave.cloud/x` are
reserved; `coreweave.cloud.example.com/x` and `notcoreweave.cloud/x` are not. Labels that were
there already, unchanged, pass (so updates of old objects keep working)."""

from __future__ import annotations

from quorum.webhooks.objects import LABELLED_KINDS, WORKLOAD_KINDS, labels_of, pod_shape
from quorum.webhooks.review import AdmissionRequest, Decision
from quorum.webhooks.settings import WebhookSettings


def reserved_domain(key: str, domains: tuple[str, ...]) -> str | None:
    """The reserved domain a label key falls under, or None."""
    prefix, slash, _ = key.rpartition("/")
    if not slash:
        return None
    prefix = prefix.lower()
    for domain in domains:
        if prefix == domain or prefix.endswith("." + domain):
            return domain
    return None


def changed_reserved_keys(
    new: dict[str, str], old: dict[str, str] | None, settings: WebhookSettings
) -> tuple[list[str], list[str]]:
    """Reserved keys that `new` adds or changes, and those it removes, compared with `old`
    (None on CREATE)."""
    old = old or {}

    def reserved(key: str) -> bool:
        return (
            key not in settings.user_settable_labels
            and reserved_domain(key, settings.reserved_label_domains) is not None
        )

    changed = [k for k, v in new.items() if reserved(k) and (k not in old or old[k] != v)]
    removed = [k for k in old if reserved(k) and k not in new]
    return changed, removed


def is_platform(request: AdmissionRequest, settings: WebhookSettings) -> bool:
    user = request.user
    return user.username in settings.platform_users or any(g in settings.platform_groups for g in user.groups)


def validate(request: AdmissionRequest, settings: WebhookSettings) -> Decision:
    if request.operation not in ("CREATE", "UPDATE") or request.object is None:
        return Decision()
    if is_platform(request, settings):
        return Decision()
    if request.kind in LABELLED_KINDS:
        new, old, where = (
            labels_of(request.object),
            (labels_of(request.old_object) if request.old_object is not None else None),
            "metadata.labels",
        )
    elif request.kind in WORKLOAD_KINDS:
        shape = pod_shape(request.kind, request.object)
        if shape is None:
            return Decision()
        old_shape = pod_shape(request.kind, request.old_object)
        new, old, where = shape.labels, (old_shape.labels if old_shape else None), shape.where
    else:
        return Decision()
    changed, removed = changed_reserved_keys(new, old, settings)
    if not changed and not removed:
        return Decision()
    domains = " or ".join(f"*.{d}" for d in settings.reserved_label_domains)
    exceptions = ", ".join(settings.user_settable_labels) or "none"
    name = request.name or "(new)"
    if changed:
        listed = ", ".join(f'"{k}"' for k in sorted(changed))
        what, fix = f"label {listed} in {where} is in a reserved domain", "Remove the label"
    else:
        listed = ", ".join(f'"{k}"' for k in sorted(removed))
        what, fix = f"removing label {listed} from {where}: it is in a reserved domain", "Keep the label"
    return Decision(
        denied=(
            f"{request.kind} {name}: {what}. Namespaces `{domains}` are not allowed: labels under "
            f"these domains and their subdomains are set, changed and removed by the platform only. "
            f"{fix} (labels users may set: {exceptions})."
        )
    )
