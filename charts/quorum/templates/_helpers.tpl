{{/*
The chart renders the repository's manifests/ and crds/ (linked into files/; `helm package`
copies them in) with the values' substitutions and edits. quorum/install_values.py makes the
same ones for `quorum manifests --values`; tests/packaging/test_chart.py requires both to give
the same objects. Change one, change the other.
*/}}

{{/* quorum's namespace: namespace.name, else the release's. */}}
{{- define "quorum.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{- define "quorum.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* What Helm adds to each object (install_values adds none of it). */}}
{{- define "quorum.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* ['a', 'b']: a list literal CEL and YAML both read (install_values.cel_strings). */}}
{{- define "quorum.celStrings" -}}
{{- $quoted := list -}}
{{- range . -}}{{- $quoted = append $quoted (printf "'%s'" .) -}}{{- end -}}
[{{ join ", " $quoted }}]
{{- end -}}

{{/*
A file of the repository for these values (install_values.substituted): quorum-system becomes
quorum's namespace, the webhook port's and the Slurm hook port's sources the given address
blocks, and the platform identities the given ones. Called with (dict "root" $ "file" PATH).
*/}}
{{- define "quorum.text" -}}
{{- $root := .root -}}
{{- $text := $root.Files.Get .file -}}
{{- if not $text -}}
{{- fail (printf "%s is not in the chart: files/ links to the repository's manifests/, crds/ and dashboards/; install from a checkout or a `helm package`d chart" .file) -}}
{{- end -}}
{{- $namespace := include "quorum.namespace" $root -}}
{{- /* Twice: a match takes the character after the name, so a name right after another needs a second pass. */ -}}
{{- range until 2 -}}
{{- $text = regexReplaceAll "(^|[^\\w-])quorum-system([^\\w-]|$)" $text (printf "${1}%s${2}" $namespace) -}}
{{- end -}}
{{- with $root.Values.networkPolicy.apiserverCidrs -}}
{{- $blocks := "" -}}
{{- range . -}}{{- $blocks = printf "%s${1}- ipBlock: {cidr: %s}\n" $blocks (quote .) -}}{{- end -}}
{{- $text = regexReplaceAll "(?m)^( *)- ipBlock: \\{cidr: 0\\.0\\.0\\.0/0\\}\\n *- ipBlock: \\{cidr: \"::/0\"\\}\\n" $text $blocks -}}
{{- end -}}
{{- with $root.Values.sunk.slurmCidrs -}}
{{- $blocks := "" -}}
{{- range . -}}{{- $blocks = printf "%s${1}- ipBlock: {cidr: %s}\n" $blocks (quote .) -}}{{- end -}}
{{- $text = regexReplaceAll "(?m)^( *)- namespaceSelector: \\{matchLabels: \\{kubernetes\\.io/metadata\\.name: tenant-slurm\\}\\}  # the Slurm nodes\\n" $text $blocks -}}
{{- end -}}
{{- $text = replace "'cw-coscheduler', 'coscheduler', 'scheduler-plugins-scheduler'" (include "quorum.coschedulerItems" $root) $text -}}
{{- if eq $root.Values.schedulers.placement "kube-scheduler" -}}
{{- $text = replace "'quorum' == 'kube-scheduler'" "'kube-scheduler' == 'kube-scheduler'" $text -}}
{{- $text = replace "\n    placement: quorum\n" "\n    placement: kube-scheduler\n" $text -}}
{{- $text = replace "QUORUM_OPERATOR_PLACEMENT, value: quorum}" "QUORUM_OPERATOR_PLACEMENT, value: kube-scheduler}" $text -}}
{{- end -}}
{{- $users := include "quorum.celStrings" $root.Values.platform.users -}}
{{- $groups := include "quorum.celStrings" $root.Values.platform.groups -}}
{{- $text = replace "['quorum:node-lifecycle']" $users $text -}}
{{- $text = replace "g in []" (printf "g in %s" $groups) $text -}}
{{- $text = replace "platform_users: [\"quorum:node-lifecycle\"]" (printf "platform_users: %s" $users) $text -}}
{{- $text = replace "platform_groups: []" (printf "platform_groups: %s" $groups) $text -}}
{{- $text -}}
{{- end -}}

{{/*
The coscheduler names quorum takes, as CEL list items ('a', 'b'): schedulers.coschedulerNames,
without scheduler-plugins' where scheduler-plugins runs, with `volcano` where its dialect is on
(install_values.SchedulersValues.names).
*/}}
{{- define "quorum.coschedulerItems" -}}
{{- $names := list -}}
{{- if has "default-scheduler" .Values.schedulers.coschedulerNames -}}
{{- fail "schedulers.coschedulerNames: default-scheduler is not a coscheduler name (every pod has it; quorum takes its gang pods anyway): remove it" -}}
{{- end -}}
{{- range .Values.schedulers.coschedulerNames -}}
{{- if not (and $.Values.schedulers.schedulerPlugins (eq . "scheduler-plugins-scheduler")) -}}
{{- $names = append $names . -}}
{{- end -}}
{{- end -}}
{{- if and .Values.schedulers.volcano (not (has "volcano" $names)) -}}
{{- $names = append $names "volcano" -}}
{{- end -}}
{{- if not $names -}}
{{- fail "schedulers: no coscheduler name is left once scheduler-plugins' is left to it; name at least one in coschedulerNames (cw-coscheduler, say)" -}}
{{- end -}}
{{- $quoted := list -}}
{{- range $names -}}{{- $quoted = append $quoted (printf "'%s'" .) -}}{{- end -}}
{{- join ", " $quoted -}}
{{- end -}}

{{/*
Whether scheduling.volcano.sh's PodGroup CRD is this release's to install: absent, or installed
by this release (as quorum.schedulerPluginsCrdIsOurs).
*/}}
{{- define "quorum.volcanoCrdIsOurs" -}}
{{- $crd := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "podgroups.scheduling.volcano.sh" -}}
{{- if not $crd -}}
true
{{- else -}}
{{- $annotations := $crd.metadata.annotations | default dict -}}
{{- if and (eq (index $annotations "meta.helm.sh/release-name" | default "") .Release.Name) (eq (index $annotations "meta.helm.sh/release-namespace" | default "") .Release.Namespace) -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The objects of a file, as a JSON list (templates return text). */}}
{{- define "quorum.documents" -}}
{{- $docs := list -}}
{{- range $chunk := regexSplit "(?m)^---[ \\t]*$" (include "quorum.text" .) -1 -}}
{{- $doc := fromYaml $chunk -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "%s: %s" $.file $doc.Error) -}}
{{- end -}}
{{- if $doc -}}
{{- $docs = append $docs $doc -}}
{{- end -}}
{{- end -}}
{{- toJson $docs -}}
{{- end -}}

{{/*
One object as the values have it (install_values.edit): changed in place; prints "drop" for
an object left out. Called with (dict "root" $ "doc" OBJECT).
*/}}
{{- /*
How pods are admitted (install_values.WebhooksValues.pod_admission): webhooks.podAdmission, and
for auto what the cluster serves.
*/ -}}
{{- define "quorum.podAdmission" -}}
{{- $way := .Values.webhooks.podAdmission | default "auto" -}}
{{- if eq $way "auto" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}policies{{- else -}}webhooks{{- end -}}
{{- else -}}{{ $way }}{{- end -}}
{{- end -}}

{{- define "quorum.edit" -}}
{{- $values := .root.Values -}}
{{- $doc := .doc -}}
{{- $kind := $doc.kind -}}
{{- $name := $doc.metadata.name -}}
{{- if and (eq $kind "Namespace") (not $values.namespace.create) -}}
drop
{{- else if and (eq $kind "PodDisruptionBudget") (eq $name "quorum-webhooks") (lt (int $values.webhooks.replicas) 2) -}}
drop
{{- else -}}
{{- if and (eq $kind "MutatingWebhookConfiguration") (eq (include "quorum.podAdmission" .root) "webhooks") -}}
{{- range $doc.webhooks -}}
{{- $kept := list -}}
{{- range (.matchConditions | default list) -}}{{- if ne .name "what-quorum-pod-defaults-left-undone" -}}{{- $kept = append $kept . -}}{{- end -}}{{- end -}}
{{- if $kept -}}{{- $_ := set . "matchConditions" $kept -}}{{- else -}}{{- $_ := unset . "matchConditions" -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if has $kind (list "MutatingWebhookConfiguration" "ValidatingWebhookConfiguration") -}}
{{- if ne $values.certificates.mode "certManager" -}}
{{- $annotations := $doc.metadata.annotations | default dict -}}
{{- $_ := unset $annotations "cert-manager.io/inject-ca-from" -}}
{{- if not $annotations -}}{{- $_ := unset $doc.metadata "annotations" -}}{{- end -}}
{{- end -}}
{{- if eq $values.certificates.mode "secret" -}}
{{- $pem := b64dec $values.certificates.secret.caBundle -}}
{{- if not (contains "-----BEGIN CERTIFICATE-----" $pem) -}}
{{- fail "certificates.secret.caBundle must be the base64 of the PEM CA certificate that signed the Secret's tls.crt (e.g. kubectl get secret NAME -o jsonpath='{.data.ca\\.crt}')" -}}
{{- end -}}
{{- range $doc.webhooks -}}{{- $_ := set .clientConfig "caBundle" $values.certificates.secret.caBundle -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq $kind "Deployment" -}}
{{- $pod := $doc.spec.template.spec -}}
{{- $container := index $pod.containers 0 -}}
{{- $_ := set $container "image" (include "quorum.image" .root) -}}
{{- with $values.image.pullPolicy -}}{{- $_ := set $container "imagePullPolicy" . -}}{{- end -}}
{{- with $values.image.pullSecrets -}}
{{- $secrets := list -}}
{{- range . -}}{{- $secrets = append $secrets (dict "name" .) -}}{{- end -}}
{{- $_ := set $pod "imagePullSecrets" $secrets -}}
{{- end -}}
{{- if eq $name "quorum-webhooks" -}}
{{- $_ := set $doc.spec "replicas" $values.webhooks.replicas -}}
{{- $_ := set $container "resources" $values.webhooks.resources -}}
{{- if eq $values.certificates.mode "secret" -}}
{{- range $pod.volumes -}}
{{- if eq .name "tls" -}}{{- $_ := set .secret "secretName" $values.certificates.secret.name -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- else if eq $name "quorum-operator" -}}
{{- $_ := set $doc.spec "replicas" $values.operator.replicas -}}
{{- $_ := set $container "resources" $values.operator.resources -}}
{{- $env := list -}}
{{- range $container.env -}}
{{- if eq .name "QUORUM_OPERATOR_ORG" -}}{{- $_ := set . "value" $values.operator.settings.org -}}{{- end -}}
{{- $env = append $env . -}}
{{- end -}}
{{- range $key, $value := $values.operator.settings -}}
{{- if ne $key "org" -}}
{{- $text := ternary $value (toJson $value) (kindIs "string" $value) -}}
{{- $env = append $env (dict "name" (printf "QUORUM_OPERATOR_%s" (snakecase $key | upper)) "value" $text) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $container "env" $env -}}
{{- else if eq $name "quorum-sunk-scheduler" -}}
{{- range $container.env -}}
{{- if eq .name "QUORUM_SUNK_SLURM_URL" -}}{{- $_ := set . "value" $values.sunk.slurmUrl -}}{{- end -}}
{{- if eq .name "QUORUM_SUNK_NAMESPACES" -}}{{- $_ := set . "value" (toJson $values.sunk.namespaces) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* An object with Helm's labels, as a YAML document. Called with (dict "root" $ "doc" OBJECT). */}}
{{- define "quorum.emit" -}}
{{- $metadata := .doc.metadata -}}
{{- $labels := $metadata.labels | default dict -}}
{{- range $key, $value := include "quorum.helmLabels" .root | fromYaml -}}
{{- $_ := set $labels $key $value -}}
{{- end -}}
{{- $_ := set $metadata "labels" $labels }}
---
{{ toYaml .doc }}
{{- end -}}

{{/*
Whether scheduling.x-k8s.io's PodGroup CRD is this release's to install: absent, or installed
by this release. One installed otherwise (scheduler-plugins', or `kubectl create -f
crds/scheduler-plugins/`) stays as it is: Helm neither takes it over nor deletes it. Without a
cluster (`helm template`) it is rendered.
*/}}
{{- define "quorum.schedulerPluginsCrdIsOurs" -}}
{{- $crd := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "podgroups.scheduling.x-k8s.io" -}}
{{- if not $crd -}}
true
{{- else -}}
{{- $annotations := $crd.metadata.annotations | default dict -}}
{{- if and (eq (index $annotations "meta.helm.sh/release-name" | default "") .Release.Name) (eq (index $annotations "meta.helm.sh/release-namespace" | default "") .Release.Namespace) -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The pod of a hook Job: restricted like quorum's own (the namespace enforces it). No
system-cluster-critical priority, unlike quorum's Deployments: a pre-install hook runs before the
release's ResourceQuota that lets quorum's namespace use that class exists (refused where the
platform limits the system classes to namespaces with a quota), Kubernetes 1.37's WorkloadWithJob
gives each Job a PodGroup whose priority may not exceed 1000000000 (the Job would never make its
pod), and a short hook should not preempt a tenant's pod.
*/}}
{{- define "quorum.hookPod" -}}
serviceAccountName: {{ .serviceAccount }}
restartPolicy: Never
tolerations:
  - {key: is_cpu_compute, operator: Exists, effect: NoSchedule}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile: {type: RuntimeDefault}
{{- with .root.Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
containers:
  - name: {{ .name }}
    image: {{ include "quorum.image" .root }}
    {{- with .root.Values.image.pullPolicy }}
    imagePullPolicy: {{ . }}
    {{- end }}
    command: {{ toJson .command }}
    resources:
      requests: {cpu: 50m, memory: 96Mi}
      limits: {memory: 256Mi}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
{{- end -}}
