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
{{- if and (not .Values.nats.embedded.enabled) .Values.nats.urlSecret.name }}
- name: TAU_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.nats.urlSecret.name }}
      key: {{ .Values.nats.urlSecret.key }}
{{- else }}
- name: TAU_NATS_URL
  value: {{ include "taugrid.natsUrl" . | quote }}
{{- end }}
- name: TAU_BACKEND
  value: kubernetes
- name: TAU_CLUSTER
  value: {{ .Values.backend.cluster | quote }}
- name: TAU_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- include "taugrid.authEnv" . }}
{{- if include "taugrid.natsCa" . }}
- name: TAU_NATS_CA
  value: /etc/taugrid/nats-ca/ca.crt
{{- end }}
{{- with .Values.otel.endpoint }}
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
