{{/* Chart name, overridable. */}}
{{- define "nstance-server.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name when it already contains the chart name. */}}
{{- define "nstance-server.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Objects of one shard: dict "root" $ "shard" ID. */}}
{{- define "nstance-server.shardName" -}}
{{- printf "%s-%s" (include "nstance-server.fullname" .root) .shard | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nstance-server.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "nstance-server.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nstance
{{- end }}

{{/* Selector of one shard's pods: dict "root" $ "shard" ID. */}}
{{- define "nstance-server.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nstance-server.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
nstance.dev/shard: {{ .shard | quote }}
{{- end }}

{{- define "nstance-server.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nstance-server.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "nstance-server.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "nstance-server.keySecretName" -}}
{{- default (printf "%s-encryption-key" (include "nstance-server.fullname" .)) .Values.encryptionKey.existingSecret }}
{{- end }}
