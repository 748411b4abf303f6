"""The identities of a local cluster, as in a real CKS cluster (docs/architecture.md): the admin, the
control-plane components, kwok, the platform identity that owns the *.coreweave.cloud node
labels, a customer who is cluster-admin by RBAC but not system:masters, and a namespace-scoped
tenant. Each gets a client certificate signed by the instance's CA and a self-contained
kubeconfig."""

from __future__ import annotations

from devcluster.config import Layout
from devcluster.kubeconfig import write_kubeconfig
from quorum import pki

# Identities that get a client certificate: kubeconfig name -> (user, groups).
CLIENT_IDENTITIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("quorum-admin", ("system:masters",)),
    "controller-manager": ("system:kube-controller-manager", ()),
    "scheduler": ("system:kube-scheduler", ()),
    # kwok plays every kubelet; without the Node authorizer that needs broad rights.
    "kwok": ("kwok", ("system:masters",)),
    "platform": ("quorum:node-lifecycle", ("quorum:platform",)),
    "customer": ("customer@example.com", ("quorum:customers",)),
    # A namespace-scoped tenant: no rights until a test binds `edit` in its namespace.
    "tenant": ("tenant@example.com", ("quorum:tenants",)),
}


def write_identities(layout: Layout, name: str, server: str) -> None:
    """The instance's CA, the apiserver's serving certificate, the front-proxy CA, the
    ServiceAccount signing keys, and a client certificate and kubeconfig per identity."""
    d = layout.pki
    ca = pki.CertificateAuthority.create(f"quorum-dev-{name}-ca")
    ca.pair.write(d, "ca")
    ca.issue(
        "kube-apiserver",
        client=False,
        server_names=(
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.0.0.1",
        ),
    ).write(d, "apiserver")
    front_proxy = pki.CertificateAuthority.create(f"quorum-dev-{name}-front-proxy-ca")
    front_proxy.pair.write(d, "front-proxy-ca")
    front_proxy.issue("front-proxy-client").write(d, "front-proxy-client")
    sa = pki.service_account_keys()
    (d / "sa.pub").write_bytes(sa.cert_pem)
    (d / "sa.key").write_bytes(sa.key_pem)
    for who, (user, groups) in CLIENT_IDENTITIES.items():
        pair = ca.issue(user, groups)
        pair.write(d, who)
        write_kubeconfig(
            layout.kubeconfig(who),
            server=server,
            ca_pem=ca.pair.cert_pem,
            user=user,
            cert_pem=pair.cert_pem,
            key_pem=pair.key_pem,
        )
