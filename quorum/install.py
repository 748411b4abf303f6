"""Where quorum is installed: its namespace, and the identities that follow from it.

The manifests in `manifests/` are the install for the namespace `quorum-system`; `quorum
manifests --namespace X` writes the same manifests for namespace X. Every place that depends on
the namespace (the Namespace itself, the ServiceAccounts and their bindings, the webhook
Service references, the namespaceSelectors that leave quorum's own namespace out, the operator's
username in the CEL of the admission policies and in the webhook server's settings, the
cert-manager names) is written in the manifests as `quorum-system` and replaced here, so this
function is the one place that sets it.

Why not ValidatingAdmissionPolicy parameters for the operator's username: a parameter object
that is missing makes a binding with `parameterNotFoundAction: Deny` refuse every request it
matches (every pod update in the cluster), or with `Allow` silently switches the protection off;
and the apiserver converts the parameter for CEL on every evaluation. A name written into the
policy has neither failure mode.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from quorum.core.gangs import COSCHEDULER_NAMES, DEFAULT_SCHEDULER, Placer
from quorum.core.removal import OPERATOR_SERVICE_ACCOUNT as OPERATOR_SERVICE_ACCOUNT  # named once, there

DEFAULT_NAMESPACE = "quorum-system"
WEBHOOKS_SERVICE_ACCOUNT = "quorum-webhooks"
MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"

_NAMESPACE_TOKEN = re.compile(rf"(?<![\w-]){re.escape(DEFAULT_NAMESPACE)}(?![\w-])")
_ANY_ADDRESS = re.compile(
    r'^( *)- ipBlock: \{cidr: 0\.0\.0\.0/0\}\n\1- ipBlock: \{cidr: "::/0"\}\n', re.MULTILINE
)
# The Slurm nodes quorum-sunk-scheduler's hook port admits (manifests/optional/sunk-scheduler.yaml).
_SLURM_NODES = re.compile(
    r"^( *)- namespaceSelector: \{matchLabels: \{kubernetes\.io/metadata\.name: tenant-slurm\}\}"
    r"  # the Slurm nodes\n",
    re.MULTILINE,
)
SUNK_MANIFEST = "optional/sunk-scheduler.yaml"
# The admission policies that fence quorum's decisions; `--static-admission` moves them to the
# apiserver's disk (manifest-based admission configuration, Kubernetes 1.37).
PROTECTIVE_MANIFESTS = (
    "36-pod-policies.yaml",
    "40-gate-protection.yaml",
    "45-gang-backstop.yaml",
    "47-operator-fence.yaml",
    "48-tenant-fence.yaml",
)
# How pods are admitted (docs/webhooks.md, "Two ways to admit pods"): `policies`, inside the
# apiserver (MutatingAdmissionPolicy, manifests/35-pod-defaults.yaml), quorum-webhooks called only
# for what that policy left undone (a gang name quorum must shorten, a gang pod another mutating
# webhook made after it); `webhooks`, pods.mutate.quorum.dev for every pod, for a cluster that does
# not serve MutatingAdmissionPolicy. Everything else is the same in both.
POD_ADMISSION_WAYS = ("policies", "webhooks")
POD_DEFAULTS_MANIFEST = "35-pod-defaults.yaml"
POD_DEFAULTS_KINDS = frozenset({"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"})
FALLBACK_CONDITION = "what-quorum-pod-defaults-left-undone"  # pods.mutate.quorum.dev's, in `policies`
_FALLBACK_CONDITION_TEXT = re.compile(
    r"^    # With quorum-pod-defaults .*?^    matchConditions:\n      - name: "
    + re.escape(FALLBACK_CONDITION)
    + r"\n.*?(?=^---$)",
    re.MULTILINE | re.DOTALL,
)
STATIC_SUFFIX = ".static.k8s.io"  # the apiserver loads policies from disk only under such names
STATIC_MODES = ("off", "protect", "all")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# The coscheduler names as every list in the manifests writes them (CEL and YAML both read it):
# the CEL of the policies, the webhooks' settings and the operator's (one setting, rendered).
COSCHEDULERS_TEXT = ", ".join(f"'{name}'" for name in COSCHEDULER_NAMES)
SCHEDULER_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a DNS subdomain, as Kubernetes has it


# The policies' CEL says "placement kube-scheduler" as this comparison, false as written; an
# install under that placement renders it true (docs/placement.md).
DELEGATED_TEXT = f"'{Placer.QUORUM}' == '{Placer.KUBE_SCHEDULER}'"


def with_placement(text: str, placement: Placer) -> str:
    """`text` with the policies' placement test made true where kube-scheduler places gangs."""
    if placement is Placer.QUORUM:
        return text
    for written, rendered in (
        (DELEGATED_TEXT, f"'{placement}' == '{Placer.KUBE_SCHEDULER}'"),
        (f"\n    placement: {Placer.QUORUM}\n", f"\n    placement: {placement}\n"),  # quorum-webhooks
        (
            f"QUORUM_OPERATOR_PLACEMENT, value: {Placer.QUORUM}}}",
            f"QUORUM_OPERATOR_PLACEMENT, value: {placement}}}",
        ),
    ):
        text = text.replace(written, rendered)
    return text


def with_coschedulers(text: str, names: tuple[str, ...]) -> str:
    """`text` with the install's coscheduler names in place of the defaults."""
    if not names or not all(SCHEDULER_NAME.fullmatch(n) and n != DEFAULT_SCHEDULER for n in names):
        raise ValueError(
            f"coscheduler names {list(names)!r}: at least one, each a DNS subdomain (lower-case letters, "
            f"digits, '-' and '.'), as a pod's schedulerName is, and not {DEFAULT_SCHEDULER}"
        )
    return text.replace(COSCHEDULERS_TEXT, ", ".join(f"'{name}'" for name in names))


class InvalidNamespace(ValueError):
    pass


def check_namespace(namespace: str) -> str:
    if not _DNS_LABEL.fullmatch(namespace):
        raise InvalidNamespace(
            f"{namespace!r} is not a namespace name: use lower-case letters, digits and '-', "
            "start and end with a letter or digit, at most 63 characters (e.g. gpu-admission)"
        )
    return namespace


def operator_username(namespace: str) -> str:
    """The username the apiserver gives the operator's ServiceAccount token."""
    return f"system:serviceaccount:{namespace}:{OPERATOR_SERVICE_ACCOUNT}"


def render(
    manifest: str,
    namespace: str,
    apiserver_cidrs: tuple[str, ...] = (),
    slurm_cidrs: tuple[str, ...] = (),
    coschedulers: tuple[str, ...] = COSCHEDULER_NAMES,
    placement: Placer = Placer.QUORUM,
) -> str:
    """`manifest` (written for quorum-system) for `namespace`; with `apiserver_cidrs`, the
    webhook NetworkPolicy admits those address blocks instead of any address; with
    `slurm_cidrs`, quorum-sunk-scheduler's hook port admits those instead of Slurm's namespace;
    with `coschedulers`, those scheduler names are quorum's instead of the defaults; with
    `placement`, who places gang pods."""
    text = with_placement(_NAMESPACE_TOKEN.sub(check_namespace(namespace), manifest), placement)
    if coschedulers != COSCHEDULER_NAMES:
        text = with_coschedulers(text, coschedulers)
    for pattern, cidrs in ((_ANY_ADDRESS, apiserver_cidrs), (_SLURM_NODES, slurm_cidrs)):
        if cidrs:
            text = pattern.sub(functools.partial(_address_blocks, cidrs), text)
    return text


def check_pod_admission(way: str) -> str:
    if way not in POD_ADMISSION_WAYS:
        raise ValueError(f"pod admission {way!r}: one of {', '.join(POD_ADMISSION_WAYS)}")
    return way


def for_pod_admission(text: str, way: str) -> str:
    """A manifest's text for a way of admitting pods: with `webhooks`, pods.mutate.quorum.dev
    loses the condition that leaves it only what quorum-pod-defaults cannot do."""
    if check_pod_admission(way) == "policies":
        return text
    edited = _FALLBACK_CONDITION_TEXT.sub("", text)
    if FALLBACK_CONDITION in edited:  # reworded around it: never ship a condition left in place
        raise ValueError(f"{FALLBACK_CONDITION}: not where `for_pod_admission` expects it in the manifest")
    return edited


def without_fallback_condition(doc: dict[str, Any]) -> dict[str, Any]:
    """`for_pod_admission(webhooks)` on a parsed MutatingWebhookConfiguration."""
    for webhook in doc.get("webhooks") or []:
        kept = [c for c in webhook.get("matchConditions") or [] if c.get("name") != FALLBACK_CONDITION]
        if kept:
            webhook["matchConditions"] = kept
        else:
            webhook.pop("matchConditions", None)
    return doc


def _address_blocks(cidrs: tuple[str, ...], match: re.Match[str]) -> str:
    """One `ipBlock` source per address block, in place of the matched source."""
    blocks = [str(ipaddress.ip_network(c, strict=False)) for c in cidrs]
    return "".join(f'{match[1]}- ipBlock: {{cidr: "{b}"}}\n' for b in blocks)


def render_files(
    names: list[str] | None,
    namespace: str,
    directory: Path = MANIFESTS,
    apiserver_cidrs: tuple[str, ...] = (),
    slurm_cidrs: tuple[str, ...] = (),
    pod_admission: str = "policies",
    coschedulers: tuple[str, ...] = COSCHEDULER_NAMES,
    placement: Placer = Placer.QUORUM,
) -> str:
    """The manifests `names` (default: every manifests/*.yaml, in order) as one stream, for a way
    of admitting pods (`webhooks` leaves out the MutatingAdmissionPolicy)."""
    paths = [directory / n for n in names] if names is not None else sorted(directory.glob("*.yaml"))
    if check_pod_admission(pod_admission) == "webhooks":
        paths = [p for p in paths if p.name != POD_DEFAULTS_MANIFEST]
    return (
        "\n---\n".join(
            for_pod_admission(
                render(p.read_text(), namespace, apiserver_cidrs, slurm_cidrs, coschedulers, placement),
                pod_admission,
            ).strip()
            for p in paths
        )
        + "\n"
    )


def static_policies(text: str) -> str:
    """API admission policies made manifest-based: each policy's and binding's name, and each
    binding's policyName, end in `.static.k8s.io`; their labels are dropped (not API objects)."""
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        if doc.get("apiVersion") != "admissionregistration.k8s.io/v1":
            raise ValueError(
                f"{doc.get('kind')} {doc['metadata'].get('name')}: only admission policies can be static"
            )
        doc["metadata"] = {"name": doc["metadata"]["name"] + STATIC_SUFFIX}
        if doc["kind"].endswith("Binding"):
            doc["spec"]["policyName"] += STATIC_SUFFIX
    return yaml.safe_dump_all(docs, sort_keys=False)


def static_admission(
    mode: str, namespace: str, directory: Path = MANIFESTS, placement: Placer = Placer.QUORUM
) -> dict[str, str]:
    """The files of the ValidatingAdmissionPolicy plugin's `staticManifestsDir`, by name: with
    `protect`, quorum's self-protection (manifests/static/); with `all`, its protective policies
    too (which are then not applied as API objects)."""
    if mode not in STATIC_MODES:
        raise ValueError(f"static admission {mode!r}: one of {', '.join(STATIC_MODES)}")
    if mode == "off":
        return {}
    files = {p.name: render(p.read_text(), namespace) for p in sorted((directory / "static").glob("*.yaml"))}
    if mode == "all":
        files["quorum-fences.yaml"] = static_policies(
            render_files(list(PROTECTIVE_MANIFESTS), namespace, directory, placement=placement)
        )
    return files


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "manifests",
        help="print quorum's manifests for a namespace (kubectl apply -f -)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--values",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="render the install the Helm chart makes with these values (charts/quorum/values.yaml "
        "has them all; docs/install.md): CRDs, certificates, platform identities, replicas, settings. "
        "Repeat to merge files in turn, as helm -f does; the options below override them. Without "
        "it: manifests/ as written, for the namespace",
    )
    parser.add_argument("--namespace", default=None, help=f"where quorum runs (default {DEFAULT_NAMESPACE})")
    parser.add_argument("--dir", type=Path, default=None, help="the manifests to render (not with --values)")
    parser.add_argument(
        "--apiserver-cidr",
        action="append",
        default=[],
        help="address block of the apiserver (repeat): the only one the webhook port admits "
        "besides scrapers (default: any address; see manifests/60-network-policy.yaml)",
    )
    parser.add_argument(
        "--slurm-cidr",
        action="append",
        default=[],
        help=f"address block of the Slurm nodes (repeat): also print manifests/{SUNK_MANIFEST}, its hook "
        "port admitting only these blocks (default: that manifest is not printed; as written it admits "
        "the pods of namespace tenant-slurm)",
    )
    parser.add_argument(
        "--static-admission",
        type=Path,
        default=None,
        metavar="DIR",
        help="write quorum's self-protection and its protective admission policies into DIR, for the "
        "kube-apiserver's manifest-based admission configuration (Kubernetes 1.37; docs/threat-model.md), "
        "and print the other manifests only",
    )
    parser.add_argument(
        "--pod-admission",
        choices=POD_ADMISSION_WAYS,
        default=None,
        help="how pods are admitted: `policies` (default), in the apiserver by a MutatingAdmissionPolicy "
        "(Kubernetes 1.36+), quorum-webhooks called only for gang names it must shorten; `webhooks`, "
        "quorum-webhooks called for every pod, for a cluster that does not serve "
        "admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (docs/webhooks.md)",
    )
    parser.add_argument(
        "--placement",
        choices=[p.value for p in Placer],
        default=None,
        help="who places gang pods: `quorum` (default), each held at quorum's gate until its gang fits; "
        "`kube-scheduler`, each made to name a Kubernetes PodGroup that kube-scheduler's gang cycle "
        "places (Kubernetes 1.37+, scheduling.k8s.io/v1beta1 served; docs/placement.md)",
    )
    parser.set_defaults(func=run)


class NoCheckout(ValueError):
    pass


def check_checkout(directory: Path) -> None:
    """`quorum manifests` renders the repository's files: say so where they are not (the wheel
    and the image hold the processes and commands, not the manifests)."""
    if not directory.is_dir() or not any(directory.glob("*.yaml")):
        raise NoCheckout(
            f"no manifests in {directory}: `quorum manifests` renders a checkout's manifests/ and crds/; "
            "run it from a clone of the repository, or install with the Helm chart or dist/quorum.yaml "
            "(docs/install.md)"
        )


def run(args: argparse.Namespace) -> int:
    try:
        check_checkout(args.dir or MANIFESTS)
    except NoCheckout as err:
        print(f"quorum manifests: {err}", file=sys.stderr)
        return 2
    if args.values:
        return _run_with_values(args)
    args.namespace = args.namespace or DEFAULT_NAMESPACE
    args.dir = args.dir or MANIFESTS
    try:
        names = sorted(p.name for p in args.dir.glob("*.yaml"))
        placement = Placer(args.placement or Placer.QUORUM)
        if args.static_admission is not None:
            args.static_admission.mkdir(parents=True, exist_ok=True)
            for name, text in static_admission("all", args.namespace, args.dir, placement).items():
                (args.static_admission / name).write_text(text)
            names = [n for n in names if n not in PROTECTIVE_MANIFESTS]
        if args.slurm_cidr:
            names.append(SUNK_MANIFEST)
        cidrs = tuple(args.apiserver_cidr), tuple(args.slurm_cidr)
        way = args.pod_admission or "policies"
        sys.stdout.write(
            render_files(names, args.namespace, args.dir, *cidrs, pod_admission=way, placement=placement)
        )
    except (InvalidNamespace, ValueError) as err:
        print(f"quorum manifests: {err}", file=sys.stderr)
        return 2
    return 0


def _run_with_values(args: argparse.Namespace) -> int:
    """`quorum manifests --values FILE`: what `helm template` of charts/quorum makes with FILE,
    but the Helm hooks (quorum.install_values); the options map onto the values. It reads
    manifests/ and crds/ from this checkout: a development command, like `quorum manifests`."""
    from quorum import install_values  # it builds on this module

    try:
        if args.dir is not None:
            raise ValueError(
                "--dir renders manifests as written; --values renders manifests/ and crds/ as the chart does"
            )
        flags: dict[str, object] = {}
        if args.namespace is not None:
            flags["namespace"] = {"name": check_namespace(args.namespace)}
        if args.apiserver_cidr:
            cidrs = [str(ipaddress.ip_network(c, strict=False)) for c in args.apiserver_cidr]
            flags["networkPolicy"] = {"apiserverCidrs": cidrs}
        if args.slurm_cidr:
            cidrs = [str(ipaddress.ip_network(c, strict=False)) for c in args.slurm_cidr]
            flags["sunk"] = {"enabled": True, "slurmCidrs": cidrs}
        if args.pod_admission is not None:
            flags["webhooks"] = {"podAdmission": args.pod_admission}
        if args.placement is not None:
            flags["schedulers"] = {"placement": args.placement}
        files = [install_values.read_values_file(path) for path in args.values]
        values = install_values.load_values(*files, flags)
        leave_out: frozenset[str] = frozenset()
        if args.static_admission is not None:
            args.static_admission.mkdir(parents=True, exist_ok=True)
            for name, text in install_values.static_fences(values).items():
                (args.static_admission / name).write_text(text)
            leave_out = frozenset(PROTECTIVE_MANIFESTS)
        sys.stdout.write(install_values.render_values(values, leave_out=leave_out))
    except (InvalidNamespace, ValueError) as err:
        print(f"quorum manifests: {err}", file=sys.stderr)
        return 2
    return 0
