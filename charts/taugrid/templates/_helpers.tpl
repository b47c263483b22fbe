{{/* Names, labels and the pieces every workload shares. */}}

{{- define "taugrid.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Kept to 40 characters so "<fullname>-admission-watcher" and friends stay valid object names. */}}
{{- define "taugrid.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "taugrid.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "taugrid.selectorLabels" -}}
app.kubernetes.io/name: {{ include "taugrid.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Call with (dict "root" $ "component" "renderer"). */}}
{{- define "taugrid.labels" -}}
{{ include "taugrid.selectorLabels" . }}
app.kubernetes.io/part-of: taugrid
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ include "taugrid.chart" .root }}
{{- end -}}

{{- define "taugrid.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* ServiceAccount name of a component. */}}
{{- define "taugrid.sa" -}}
{{- printf "%s-%s" (include "taugrid.fullname" .root) .component -}}
{{- end -}}

{{- define "taugrid.natsUrl" -}}
{{- if .Values.nats.embedded.enabled -}}
{{- printf "nats://%s-nats.%s.svc:4222" (include "taugrid.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.nats.url -}}
{{- end -}}
{{- end -}}

{{/* What the renderer stamps on every run pod's source-fetch init container (libs/taugrid/render/source.py). */}}
{{- define "taugrid.sourceFetchEnv" -}}
- name: TAU_SOURCE_FETCH_IMAGE
  value: {{ include "taugrid.image" . | quote }}
- name: TAU_SOURCE_FETCH_NATS_URL
  value: {{ default (include "taugrid.natsUrl" .) .Values.sourceFetch.natsUrl | quote }}
- name: TAU_SOURCE_FETCH_CREDS_SECRET
  value: {{ .Values.sourceFetch.credsSecret | quote }}
{{- if include "taugrid.natsCa" . }}
# Read by the renderer and passed to run pods as TAU_NATS_CA_PEM (public), so no namespace needs a copy.
- name: TAU_SOURCE_FETCH_NATS_CA
  value: /etc/taugrid/nats-ca/ca.crt
{{- end }}
{{- end -}}

{{/*
Bus authentication (auth.enabled): every taugrid container finds its own nkey seed at /etc/taugrid/bus/creds,
a single item of the credentials Secret that `tau admin chart-credentials` writes; each pod mounts the item of
its identity only ("taugrid.busCredsVolume"). TAU_LOCAL_ADMIN names the operator's person (platform admin).
*/}}
{{- define "taugrid.authEnv" -}}
{{- if .Values.auth.enabled }}
- name: TAU_NATS_CREDS
  value: /etc/taugrid/bus/creds
- name: TAU_LOCAL_ADMIN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.auth.secretName }}
      key: local-admin
{{- end }}
{{- end -}}

{{/* The embedded server's TLS Secret (nats.embedded.tls). */}}
{{- define "taugrid.natsTlsSecret" -}}
{{- default (printf "%s-nats-tls" (include "taugrid.fullname" .)) .Values.nats.embedded.tls.secretName -}}
{{- end -}}

{{/* "true" when clients must verify the embedded server's TLS certificate against the Secret's CA. */}}
{{- define "taugrid.natsCa" -}}
{{- $t := .Values.nats.embedded.tls -}}
{{- if and .Values.nats.embedded.enabled $t.enabled $t.caKey }}true{{ end -}}
{{- end -}}

{{/* What a pod needs to reach the bus: its identity's seed and the server's CA. Call with (dict "root" $ "file"
"svc-policy.nk"); the seed is the only item of the credentials Secret this pod can read. */}}
{{- define "taugrid.busVolumes" -}}
{{- if .root.Values.auth.enabled }}
- name: bus-creds
  secret:
    secretName: {{ .root.Values.auth.secretName }}
    defaultMode: 288 # 0440: readable by the pod's fsGroup, nobody else
    items:
      - key: {{ .file }}
        path: creds
{{- end }}
{{- if include "taugrid.natsCa" .root }}
- name: nats-ca
  secret:
    secretName: {{ include "taugrid.natsTlsSecret" .root }}
    defaultMode: 292 # 0444: a CA certificate is public
    items:
      - key: {{ .root.Values.nats.embedded.tls.caKey }}
        path: ca.crt
{{- end }}
{{- end -}}

{{/* The bootstrap's view of the credentials Secret's identities.json (public keys only). */}}
{{- define "taugrid.identitiesMount" -}}
{{- if .Values.auth.enabled }}
- name: bus-identities
  mountPath: /etc/taugrid/identities
  readOnly: true
{{- end }}
{{- end -}}

{{- define "taugrid.busMounts" -}}
{{- if .Values.auth.enabled }}
- name: bus-creds
  mountPath: /etc/taugrid/bus
  readOnly: true
{{- end }}
{{- if include "taugrid.natsCa" . }}
- name: nats-ca
  mountPath: /etc/taugrid/nats-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* The env every taugrid container gets. */}}
{{- define "taugrid.commonEnv" -}}
{{ include "taugrid.envFor" (dict "root" . "name" "") }}
{{- end -}}

{{/* The env of service .name's containers (dict "root" $ "name" "renderer"): TAU_CLUSTER is its own
("taugrid.clusterOf"); a site's services are told they run at a site (TAU_SITE, as `tau up` tells a site's). */}}
{{- define "taugrid.envFor" -}}
{{- $v := .root.Values -}}
{{- if and (not $v.nats.embedded.enabled) $v.nats.urlSecret.name }}
- name: TAU_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ $v.nats.urlSecret.name }}
      key: {{ $v.nats.urlSecret.key }}
{{- else }}
- name: TAU_NATS_URL
  value: {{ include "taugrid.natsUrl" .root | quote }}
{{- end }}
- name: TAU_BACKEND
  value: kubernetes
- name: TAU_CLUSTER
  value: {{ include "taugrid.clusterOf" . | quote }}
{{- if include "taugrid.site" .root }}
- name: TAU_SITE
  value: "on"
{{- end }}
- name: TAU_LOG_LEVEL
  value: {{ $v.logLevel | quote }}
{{- include "taugrid.authEnv" .root }}
{{- if include "taugrid.natsCa" .root }}
- name: TAU_NATS_CA
  value: /etc/taugrid/nats-ca/ca.crt
{{- end }}
{{- with $v.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Pod Security Standard "restricted". */}}
{{- define "taugrid.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "taugrid.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* The parts of a bootstrap Job container that do not depend on its step (both connect as bootstrap). */}}
{{- define "taugrid.bootstrapContainer" -}}
image: {{ include "taugrid.image" .root }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
env:
  {{- include "taugrid.commonEnv" .root | trim | nindent 2 }}
resources:
  {{- toYaml .root.Values.bootstrap.resources | nindent 2 }}
securityContext:
  {{- include "taugrid.containerSecurityContext" .root | nindent 2 }}
{{- end -}}

{{/*
Many clusters (docs §13d). "taugrid.hub": "true" when this release is a control plane whose platform.config names
clusters (its NATS is the hub, it runs the dispatcher). "taugrid.site": "true" when this release is a worker
cluster's site (site.enabled): only its leaf server and the services that run at a site.
*/}}
{{- define "taugrid.hub" -}}
{{- if and (not .Values.site.enabled) .Values.platform.enabled (.Values.platform.config.clusters | default list) }}true{{ end -}}
{{- end -}}

{{- define "taugrid.site" -}}
{{- if .Values.site.enabled }}true{{ end -}}
{{- end -}}

{{/* The services a site runs against its leaf server (taugrid.stack.chartauth.SITE_SERVICES). */}}
{{- define "taugrid.siteServices" -}}
{{- list "kube-bridge" "log-shipper" "health-monitor" | toJson -}}
{{- end -}}

{{/* "true" when service .name's Deployment renders: enabled, and at a site one of the site's services; the
dispatcher only on a hub, and a hub's kube-bridge and log-shipper not at all. Call with (dict "root" $ "name" "renderer"). */}}
{{- define "taugrid.serviceOn" -}}
{{- $svc := index .root.Values.services .name -}}
{{- if and $svc $svc.enabled -}}
{{- if include "taugrid.site" .root -}}
{{- if has .name (include "taugrid.siteServices" .root | fromJsonArray) }}true{{ end -}}
{{- else if eq .name "dispatcher" -}}
{{- if include "taugrid.hub" .root }}true{{ end -}}
{{- else if and (include "taugrid.hub" .root) (has .name (list "kube-bridge" "log-shipper")) -}}
{{- /* a hub sends no run to its own Kubernetes cluster (as `tau up`'s hub runs no local cluster): a site
release in the same cluster makes it a worker too */ -}}
{{- else }}true{{ end -}}
{{- end -}}
{{- end -}}

{{/* TAU_CLUSTER of a service: a site's cluster at a site; on a hub the renderer sends every run to the dispatcher
(backend.dispatch.*, as `tau up` tells it); else backend.cluster. */}}
{{- define "taugrid.clusterOf" -}}
{{- if include "taugrid.site" .root -}}
{{- .root.Values.site.cluster -}}
{{- else if and (include "taugrid.hub" .root) (eq .name "renderer") -}}
dispatch
{{- else -}}
{{- .root.Values.backend.cluster -}}
{{- end -}}
{{- end -}}
