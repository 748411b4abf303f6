"""The values of a quorum install: one schema for the Helm chart (`charts/quorum/values.yaml`,
whose `values.schema.json` is made from this module) and for `quorum manifests --values FILE`.

Both render the same objects from the same files, `manifests/` and `crds/` (the chart reads them
through links in `charts/quorum/files/`): the text substitutions of `quorum.install.render`
(namespace, address blocks) and of `platform_identities` below, then the edits of `edit` on
each object. The chart's templates make the same substitutions and edits in Helm's template
language; `tests/packaging/test_chart.py` renders both for several value sets and requires the
same objects, so neither can drift from the other.

A values file is merged onto the defaults as Helm merges it (maps key by key, lists and scalars
replaced, a null removes the key), so `quorum manifests --values f.yaml` and `helm template -f
f.yaml` start from the same values. What only Helm does is left out here: its labels and
annotations, `lookup` (the scheduler-plugins CRD is skipped where another one is installed) and
the hook Jobs (`quorum certs ensure` after install and upgrade, `quorum uninstall
--admission-only` before delete), which a person runs by hand after `kubectl apply`.
"""

from __future__ import annotations

import base64
import binascii
import copy
import ipaddress
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel, to_snake

from quorum import __version__, install
from quorum.core import removal
from quorum.core.gangs import COSCHEDULER_NAMES, DEFAULT_SCHEDULER, VOLCANO_SCHEDULER, Placer

REPO = Path(__file__).resolve().parents[1]
CRDS = REPO / "crds"
DASHBOARD = REPO / "dashboards" / "quorum.json"
DEFAULT_IMAGE = "ghcr.io/quorum-dev/quorum"
CERT_MANAGER_ANNOTATION = "cert-manager.io/inject-ca-from"
DEFAULT_PLATFORM_USERS = ("quorum:node-lifecycle",)
# How the manifests name the platform identities: `platform.users` and `platform.groups` take
# their place (CEL string lists in the webhook conditions and the tenant fence, YAML lists in
# the webhook server's settings).
PLATFORM_USERS_CEL = "['quorum:node-lifecycle']"
PLATFORM_GROUPS_CEL = "g in []"
PLATFORM_USERS_SETTING = 'platform_users: ["quorum:node-lifecycle"]'
PLATFORM_GROUPS_SETTING = "platform_groups: []"
QUORUM_CRDS = ("quorum.dev_gangs.yaml", "scheduling.sigs.k8s.io_podgroups.yaml")
SCHEDULER_PLUGINS_CRD = "scheduler-plugins/scheduling.x-k8s.io_podgroups.yaml"
VOLCANO_CRD = "volcano/scheduling.volcano.sh_podgroups.yaml"
SCHEDULER_PLUGINS_NAME = "scheduler-plugins-scheduler"
MANIFEST_FILES = (
    "00-namespace.yaml",
    "10-rbac.yaml",
    "20-webhooks-deployment.yaml",
    "30-webhook-configurations.yaml",
    "35-pod-defaults.yaml",
    "36-pod-policies.yaml",
    "40-gate-protection.yaml",
    "45-gang-backstop.yaml",
    "47-operator-fence.yaml",
    "48-tenant-fence.yaml",
    "50-operator-deployment.yaml",
    "60-network-policy.yaml",
)
CERT_MANAGER_MANIFEST = "optional/cert-manager.yaml"

# -- types ------------------------------------------------------------------------------------

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
# A username or group, written into CEL and YAML between single quotes.
IDENTITY = r"^[^'\\\s]+$"
# An address block as Kubernetes writes it back (what `ipaddress` calls the network's own form).
CIDR = (
    r"^(((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])/(3[0-2]|[12]?[0-9])"
    r"|[0-9a-f:.]*:[0-9a-f:.]*/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))$"
)
SLURM_NAME = r"^[A-Za-z0-9_.\-]{1,64}$"
NAMESPACE_OR_ANY = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?|\*)$"


def _canonical_cidr(value: str) -> str:
    network = ipaddress.ip_network(value, strict=False)
    if str(network) != value:
        raise ValueError(f"{value!r}: write the address block as {network} (its network address and length)")
    return value


Cidr = Annotated[str, StringConstraints(pattern=CIDR), AfterValidator(_canonical_cidr)]
Identity = Annotated[str, StringConstraints(pattern=IDENTITY)]
SlurmName = Annotated[str, StringConstraints(pattern=SLURM_NAME)]
Quantity = (
    Annotated[str, StringConstraints(pattern=r"^[0-9.]+[a-zA-Z]*$")]
    | Annotated[int, Field(ge=0)]
    | Annotated[float, Field(ge=0)]
)


class _Values(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )


class NamespaceValues(_Values):
    name: Annotated[str, StringConstraints(pattern=r"^$|" + DNS_LABEL[1:])] = ""
    """Where quorum runs. Empty: the release's namespace (`helm -n`); `quorum manifests`: quorum-system."""
    create: bool = False
    """Render the Namespace itself, with Pod Security `restricted` enforced. Leave false when Helm
    or Argo CD creates it (`--create-namespace`): then label it yourself (docs/install.md)."""


class ImageValues(_Values):
    repository: Annotated[str, StringConstraints(min_length=1)] = DEFAULT_IMAGE
    """The image of every process and hook Job (built from the repository's Dockerfile)."""
    tag: str = ""
    """Empty: the chart's appVersion."""
    pull_policy: Literal["", "Always", "IfNotPresent", "Never"] = ""
    """Empty: Kubernetes' default (IfNotPresent, Always for :latest)."""
    pull_secrets: list[Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN)]] = []
    """Names of Secrets in quorum's namespace to pull the image with."""


class Resources(_Values):
    """A container's resources, as in a pod spec."""

    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


class OperatorSettingsValues(_Values):
    """quorum-operator's settings (quorum/operator/settings.py), each set as the environment
    variable QUORUM_OPERATOR_<NAME> (e.g. starvationSeconds: QUORUM_OPERATOR_STARVATION_SECONDS)."""

    org: str = ""
    """Use only nodes labelled node.coreweave.cloud/reserved=<org>; empty: any org's."""
    preemption: bool = True
    """Held gangs take the room of lower-priority work (docs/preemption.md); false: they wait."""
    preemption_timeout_seconds: float = Field(default=180.0, gt=0)
    """A preemption whose gang has not bound by then ends, and the nodes reserved for it are freed."""
    preemption_retry_seconds: float = Field(default=10.0, ge=0)
    """A held gang for which preemption found nothing to take is asked again after this long."""
    starvation_seconds: float = Field(default=60.0, ge=0)
    """A gang held this long for lack of room gets capacity held for it (one gang at a time)."""
    starvation_hold_seconds: float = Field(default=300.0, gt=0)
    """Starving gangs hold capacity in turns of this long, in queue order."""
    starvation_rest_seconds: float = Field(default=0.0, ge=0)
    """After a turn, a starving gang rests this long (0: no rest)."""
    starvation_max_share: float = Field(default=1.0, gt=0, le=1)
    """The largest share of the nodes its pods may use that one starving gang holds."""
    starvation_idle_seconds: float = Field(default=1800.0, ge=0)
    """A starving gang whose held room has not grown for this long holds nothing for as long (0: no
    bound)."""
    tenant_label: str = Field(default="", max_length=317)
    """A namespace label whose value names the tenant of its gangs (one team, many namespaces);
    empty: each namespace is a tenant."""
    member_loss_policy: Literal["Replace", "RestartGang"] = "Replace"
    """What a running gang below minMember gets unless its annotation says otherwise (docs/lifecycle.md)."""


class OperatorValues(_Values):
    replicas: int = Field(default=2, ge=1)
    """Replicas of quorum-operator; one acts at a time (a Lease), the others take over."""
    resources: Resources = Resources(requests={"cpu": "250m", "memory": "256Mi"}, limits={"memory": "1Gi"})
    settings: OperatorSettingsValues = OperatorSettingsValues()


class WebhooksValues(_Values):
    replicas: int = Field(default=2, ge=1)
    """Replicas of quorum-webhooks; with 2 or more a PodDisruptionBudget keeps one up."""
    resources: Resources = Resources(requests={"cpu": "200m", "memory": "128Mi"}, limits={"memory": "256Mi"})
    pod_admission: Literal["auto", "policies", "webhooks"] = "auto"
    """How pods are admitted (docs/webhooks.md, "Two ways to admit pods"): `policies`, in the
    apiserver by a MutatingAdmissionPolicy; `webhooks`, by quorum-webhooks for every pod; `auto`,
    `policies` where the cluster serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy
    (the chart asks the cluster; `quorum manifests`, which does not, takes `policies`)."""

    @property
    def pod_admission_way(self) -> str:
        return "webhooks" if self.pod_admission == "webhooks" else "policies"


class SecretValues(_Values):
    name: Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN)] = "quorum-webhooks-tls"
    """The Secret (type kubernetes.io/tls, in quorum's namespace) the webhook server serves with."""
    ca_bundle: str = ""
    """The CA that signed its certificate, base64-encoded PEM, as the webhook configurations' caBundle."""


class CertificatesValues(_Values):
    # What the model validator checks, said to Helm: a provided Secret needs its CA.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"mode": {"const": "secret"}}, "required": ["mode"]},
            "then": {"properties": {"secret": {"properties": {"caBundle": {"minLength": 1}}}}},
        }
    )
    mode: Literal["selfSigned", "certManager", "secret"] = "selfSigned"
    """selfSigned: a hook Job runs `quorum certs ensure` before and after each install and upgrade
    (quorum's own CA, renewed within 30 days of expiry); certManager: cert-manager makes and renews
    it (manifests/optional/cert-manager.yaml) and injects the caBundle; secret: you provide it."""
    secret: SecretValues = SecretValues()

    @model_validator(mode="after")
    def _secret_needs_its_ca(self) -> CertificatesValues:
        if self.mode == "secret":
            check_ca_bundle(self.secret.ca_bundle)
        return self


class NetworkPolicyValues(_Values):
    apiserver_cidrs: list[Cidr] = []
    """The apiserver's address blocks: the only ones the webhook port admits besides scrapers.
    Empty: any address (manifests/60-network-policy.yaml says when that is enough)."""


class PlatformValues(_Values):
    users: list[Identity] = list(DEFAULT_PLATFORM_USERS)
    """Usernames that own the reserved label domains and may mark PodGroups non-preemptible."""
    groups: list[Identity] = []
    """Groups with the same rights."""


class CrdsValues(_Values):
    install: bool = True
    """Install and upgrade quorum's CRDs (Gang, and the PodGroups of scheduling.sigs.k8s.io and of
    scheduling.x-k8s.io) with the release."""
    keep: bool = True
    """`helm uninstall` leaves the Gang CRD (quorum's records); false deletes it with them. The
    PodGroup CRDs are always left (deleting one deletes every tenant's PodGroups): by hand only."""
    scheduler_plugins: bool = True
    """Install scheduling.x-k8s.io's PodGroup CRD too. Helm skips it where another is installed
    (scheduler-plugins'), so that one stays theirs; false for tools that render without a cluster."""


class DashboardValues(_Values):
    enabled: bool = False
    """A ConfigMap holding dashboards/quorum.json, for Grafana's dashboard sidecar."""
    labels: dict[str, str] = {"grafana_dashboard": "1"}
    """The labels the sidecar looks for."""


class SunkAllowance(_Values):
    """What one namespace's pods may name in Slurm (QUORUM_SUNK_NAMESPACES, docs/sunk.md)."""

    partitions: list[SlurmName] = []
    accounts: list[SlurmName] = []
    qos: list[SlurmName] = []
    reservations: list[SlurmName] = []


class SunkValues(_Values):
    enabled: bool = False
    """quorum-sunk-scheduler: pods placed by Slurm (manifests/optional/sunk-scheduler.yaml, docs/sunk.md)."""
    slurm_cidrs: list[Cidr] = []
    """The Slurm nodes' address blocks, admitted to its hook port. Empty: the pods of namespace
    tenant-slurm."""
    slurm_url: Annotated[str, StringConstraints(pattern=r"^https?://")] = (
        "http://slurm-restapi.tenant-slurm:6820"
    )
    """slurmrestd."""
    namespaces: dict[Annotated[str, StringConstraints(pattern=NAMESPACE_OR_ANY)], SunkAllowance] = {}
    """Per namespace (or "*"), the partitions, accounts, QOS and reservations its pods may name."""


SchedulerName = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN)]


class SchedulersValues(_Values):
    """Which pods are quorum's (docs/integrations.md): one list, rendered into the webhooks', the
    operator's settings and the CEL of the in-apiserver policies."""

    coscheduler_names: Annotated[list[SchedulerName], Field(min_length=1)] = list(COSCHEDULER_NAMES)
    """Scheduler names quorum takes besides the default scheduler's: a gang pod that asks for one
    is held at quorum's gate and released to the default scheduler. CoreWeave's, the label-only
    coscheduler's, and scheduler-plugins' as KubeRay, Kubeflow Trainer and the MPI Operator write it."""
    scheduler_plugins: bool = False
    """scheduler-plugins' own scheduler runs in this cluster: quorum leaves pods that ask for
    scheduler-plugins-scheduler to it (an Event on each says so)."""
    volcano: bool = False
    """Take Volcano's dialect where Volcano does not run (LeaderWorkerSet, Kubeflow Trainer and the
    MPI Operator in their Volcano modes): schedulerName `volcano`, the group annotation
    scheduling.k8s.io/group-name and scheduling.volcano.sh PodGroups, whose CRD is installed
    where absent."""
    placement: Placer = Placer.QUORUM
    """Who places gang pods (docs/placement.md): `quorum`, each held at quorum's gate until its
    gang fits; `kube-scheduler`, each made to name a Kubernetes PodGroup that kube-scheduler's
    gang cycle places (Kubernetes 1.37+, scheduling.k8s.io/v1beta1 served)."""

    @property
    def names(self) -> tuple[str, ...]:
        names = [
            n for n in self.coscheduler_names if not (self.scheduler_plugins and n == SCHEDULER_PLUGINS_NAME)
        ]
        if self.volcano and VOLCANO_SCHEDULER not in names:
            names.append(VOLCANO_SCHEDULER)
        return tuple(names)

    @model_validator(mode="after")
    def _some_name_left(self) -> SchedulersValues:
        if DEFAULT_SCHEDULER in self.coscheduler_names:
            raise ValueError(
                f"schedulers.coschedulerNames: {DEFAULT_SCHEDULER} is not a coscheduler name (every pod "
                "has it; quorum takes its gang pods anyway): remove it"
            )
        if not self.names:
            raise ValueError(
                "schedulers: no coscheduler name is left once scheduler-plugins' is left to it; name "
                "at least one in coschedulerNames (cw-coscheduler, say)"
            )
        return self


class UninstallValues(_Values):
    probe_namespace: Annotated[str, StringConstraints(pattern=DNS_LABEL)] = "default"
    """Where the pre-delete hook dry-runs a probe pod to see the backstop gone (`quorum uninstall`)."""


class InstallValues(_Values):
    """Everything a quorum install is rendered from."""

    namespace: NamespaceValues = NamespaceValues()
    image: ImageValues = ImageValues()
    operator: OperatorValues = OperatorValues()
    webhooks: WebhooksValues = WebhooksValues()
    certificates: CertificatesValues = CertificatesValues()
    network_policy: NetworkPolicyValues = NetworkPolicyValues()
    platform: PlatformValues = PlatformValues()
    crds: CrdsValues = CrdsValues()
    sunk: SunkValues = SunkValues()
    dashboard: DashboardValues = DashboardValues()
    uninstall: UninstallValues = UninstallValues()
    schedulers: SchedulersValues = SchedulersValues()

    @model_validator(mode="after")
    def _probe_where_the_backstop_applies(self) -> InstallValues:
        problem = removal.probe_namespace_problem(self.uninstall.probe_namespace, self.quorum_namespace)
        if problem is not None:
            raise ValueError(f"uninstall.probeNamespace {problem}")
        return self

    @property
    def quorum_namespace(self) -> str:
        return self.namespace.name or install.DEFAULT_NAMESPACE

    @property
    def image_name(self) -> str:
        return f"{self.image.repository}:{self.image.tag or __version__}"


class InvalidValues(ValueError):
    pass


def check_ca_bundle(bundle: str) -> None:
    """A caBundle is base64 of PEM certificates (what `kubectl get secret -o jsonpath=
    '{.data.ca\\.crt}'` prints)."""
    try:
        pem = base64.b64decode(bundle, validate=True)
    except (binascii.Error, ValueError):
        pem = b""
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError(
            "certificates.secret.caBundle must be the base64 of the PEM CA certificate that signed the "
            "Secret's tls.crt (e.g. kubectl get secret NAME -o jsonpath='{.data.ca\\.crt}')"
        )


# -- values -----------------------------------------------------------------------------------


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` merged onto `base` as Helm merges a values file onto the chart's: maps key by
    key, anything else replaced, a null removes the key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def defaults() -> dict[str, Any]:
    return InstallValues().model_dump(by_alias=True, exclude_none=True)


def load_values(*overrides: dict[str, Any]) -> InstallValues:
    """The defaults with each of `overrides` (a values file's content, flags) merged on in turn."""
    values = defaults()
    for override in overrides:
        values = merged(values, override)
    try:
        return InstallValues.model_validate(values)
    except ValidationError as err:
        lines = [
            f"  {'.'.join(str(part) for part in e['loc']) or '(top)'}: "
            + e["msg"].removeprefix("Value error, ")
            + ("" if e["type"] == "value_error" else f" (got {e['input']!r})")
            for e in err.errors()
        ]
        raise InvalidValues(
            "values that charts/quorum/values.yaml does not allow:\n" + "\n".join(lines)
        ) from None


def read_values_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise InvalidValues(f"{path}: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidValues(f"{path}: a values file is a mapping (like charts/quorum/values.yaml)")
    return data


def schema() -> dict[str, Any]:
    """values.schema.json: what Helm checks values against before it renders anything (the
    field docstrings become its descriptions; pydantic's titles, which repeat the names, go)."""

    def untitled(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: untitled(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
        if isinstance(node, list):
            return [untitled(v) for v in node]
        return node

    generated: dict[str, Any] = untitled(InstallValues.model_json_schema(by_alias=True, mode="validation"))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **generated}


def schema_text() -> str:
    return json.dumps(schema(), indent=2) + "\n"


# -- rendering --------------------------------------------------------------------------------


def cel_strings(items: list[str]) -> str:
    """['a', 'b']: a list literal both CEL and YAML read."""
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


def platform_identities(text: str, platform: PlatformValues) -> str:
    users, groups = cel_strings(platform.users), cel_strings(platform.groups)
    return (
        text.replace(PLATFORM_USERS_CEL, users)
        .replace(PLATFORM_GROUPS_CEL, f"g in {groups}")
        .replace(PLATFORM_USERS_SETTING, f"platform_users: {users}")
        .replace(PLATFORM_GROUPS_SETTING, f"platform_groups: {groups}")
    )


def substituted(text: str, values: InstallValues) -> str:
    """A file's text for these values: its namespace, address blocks, coscheduler names and
    platform identities."""
    text = install.render(
        text,
        values.quorum_namespace,
        tuple(values.network_policy.apiserver_cidrs),
        tuple(values.sunk.slurm_cidrs),
        values.schedulers.names,
        values.schedulers.placement,
    )
    return platform_identities(text, values.platform)


def env_value(value: object) -> str:
    """A setting as an environment variable, written as Helm's `toJson` writes it (180, 0.5, true)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return str(value)


def settings_env(settings: OperatorSettingsValues) -> list[dict[str, str]]:
    """QUORUM_OPERATOR_* for every setting but org (which manifests/50 already names), in the
    order of their values' names (Helm ranges over a map so)."""
    return [
        {"name": f"QUORUM_OPERATOR_{to_snake(key).upper()}", "value": env_value(value)}
        for key, value in sorted(settings.model_dump(by_alias=True).items())
        if key != "org"
    ]


def _set_image(pod: dict[str, Any], values: InstallValues) -> dict[str, Any]:
    container: dict[str, Any] = pod["containers"][0]
    container["image"] = values.image_name
    if values.image.pull_policy:
        container["imagePullPolicy"] = values.image.pull_policy
    if values.image.pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in values.image.pull_secrets]
    return container


def _env(container: dict[str, Any], name: str) -> dict[str, Any]:
    return next(e for e in container["env"] if e["name"] == name)


def edit(doc: dict[str, Any], values: InstallValues) -> dict[str, Any] | None:
    """One object of the manifests as these values have it (None: left out). The chart's
    templates make the same edits (charts/quorum/templates/)."""
    kind, name = doc["kind"], doc["metadata"].get("name")
    if kind == "Namespace" and not values.namespace.create:
        return None
    if kind == "PodDisruptionBudget" and name == "quorum-webhooks" and values.webhooks.replicas < 2:
        return None  # one replica and minAvailable 1 would block every drain of its node
    if kind == "MutatingWebhookConfiguration" and values.webhooks.pod_admission_way == "webhooks":
        install.without_fallback_condition(doc)
    if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        if values.certificates.mode != "certManager":
            annotations = doc["metadata"].get("annotations") or {}
            annotations.pop(CERT_MANAGER_ANNOTATION, None)
            if not annotations:
                doc["metadata"].pop("annotations", None)
        if values.certificates.mode == "secret":
            for webhook in doc["webhooks"]:
                webhook["clientConfig"]["caBundle"] = values.certificates.secret.ca_bundle
    if kind != "Deployment":
        return doc
    pod = doc["spec"]["template"]["spec"]
    container = _set_image(pod, values)
    if name == "quorum-webhooks":
        doc["spec"]["replicas"] = values.webhooks.replicas
        container["resources"] = values.webhooks.resources.model_dump(exclude_none=True)
        if values.certificates.mode == "secret":
            for volume in pod["volumes"]:
                if volume["name"] == "tls":
                    volume["secret"]["secretName"] = values.certificates.secret.name
    elif name == "quorum-operator":
        doc["spec"]["replicas"] = values.operator.replicas
        container["resources"] = values.operator.resources.model_dump(exclude_none=True)
        _env(container, "QUORUM_OPERATOR_ORG")["value"] = values.operator.settings.org
        container["env"].extend(settings_env(values.operator.settings))
    elif name == "quorum-sunk-scheduler":
        _env(container, "QUORUM_SUNK_SLURM_URL")["value"] = values.sunk.slurm_url
        allowances = {
            ns: allowance.model_dump(exclude_unset=True) for ns, allowance in values.sunk.namespaces.items()
        }
        _env(container, "QUORUM_SUNK_NAMESPACES")["value"] = json.dumps(
            allowances, sort_keys=True, separators=(",", ":")
        )
    return doc


def sources(values: InstallValues, manifests: Path = install.MANIFESTS, crds: Path = CRDS) -> list[Path]:
    """The files an install of these values is made of, in the order `kubectl apply` needs."""
    files: list[Path] = []
    if values.crds.install:
        files += [crds / name for name in QUORUM_CRDS]
        if values.crds.scheduler_plugins:
            files.append(crds / SCHEDULER_PLUGINS_CRD)
        if VOLCANO_SCHEDULER in values.schedulers.names:  # `volcano` taken: its PodGroups must exist
            files.append(crds / VOLCANO_CRD)
    files += [
        manifests / name
        for name in MANIFEST_FILES
        if not (name == install.POD_DEFAULTS_MANIFEST and values.webhooks.pod_admission_way == "webhooks")
    ]
    if values.certificates.mode == "certManager":
        files.append(manifests / CERT_MANAGER_MANIFEST)
    if values.sunk.enabled:
        files.append(manifests / install.SUNK_MANIFEST)
    return files


_DOCUMENT_SEPARATOR = re.compile(r"^---[ \t]*$", re.MULTILINE)


def documents(text: str) -> list[str]:
    """A file's documents, each with the comments above it."""
    return [chunk.strip("\n") for chunk in _DOCUMENT_SEPARATOR.split(text) if chunk.strip()]


class _Dumper(yaml.SafeDumper):
    """Objects written out whole: the manifests' YAML anchors (shared namespaceSelectors,
    matchConditions) are not turned into &id001 references."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(doc: dict[str, Any]) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000)


def _leading_comments(chunk: str) -> str:
    lines = []
    for line in chunk.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "".join(f"{line}\n" for line in lines)


def render_values(
    values: InstallValues,
    manifests: Path = install.MANIFESTS,
    crds: Path = CRDS,
    leave_out: frozenset[str] = frozenset(),
) -> str:
    """The install of these values as one stream for `kubectl apply --server-side -f`. An object
    the values do not change is printed as written, with its comments; `leave_out`: files
    (names under manifests/) not to print."""
    chunks = []
    for path in sources(values, manifests, crds):
        if path.parent == manifests and path.name in leave_out:
            continue
        for chunk in documents(substituted(path.read_text(), values)):
            doc = yaml.safe_load(chunk)
            if doc is None:
                continue
            edited = edit(copy.deepcopy(doc), values)
            if edited is None:
                continue
            if edited == doc:
                chunks.append(chunk + "\n")
            else:
                chunks.append(_leading_comments(chunk) + dump(edited))
    if values.dashboard.enabled:
        chunks.append(dump(dashboard_config_map(values)))
    return "---\n".join(chunks)


def dashboard_config_map(values: InstallValues) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "quorum-dashboard",
            "namespace": values.quorum_namespace,
            "labels": {"app.kubernetes.io/part-of": "quorum", **values.dashboard.labels},
        },
        "data": {"quorum.json": DASHBOARD.read_text()},
    }


def static_fences(values: InstallValues, manifests: Path = install.MANIFESTS) -> dict[str, str]:
    """`--static-admission` with values: quorum's self-protection and its protective policies
    (with these values' namespace and platform identities), for the apiserver's disk."""
    namespace = values.quorum_namespace
    files = {
        p.name: install.render(p.read_text(), namespace)
        for p in sorted((manifests / "static").glob("*.yaml"))
    }
    fences = "\n---\n".join(
        substituted((manifests / n).read_text(), values) for n in install.PROTECTIVE_MANIFESTS
    )
    files["quorum-fences.yaml"] = install.static_policies(fences)
    return files
