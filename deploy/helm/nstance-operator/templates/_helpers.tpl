{{/* Chart name, overridable. */}}
{{- define "nstance-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name when it already contains the chart name. */}}
{{- define "nstance-operator.fullname" -}}
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

{{- define "nstance-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nstance-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Common labels. For clusterctl's components (values.clusterctl) no Helm
  labels: clusterctl, not Helm, manages those objects. */}}
{{- define "nstance-operator.labels" -}}
{{- if not .Values.clusterctl }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
{{ include "nstance-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: nstance
cluster.x-k8s.io/provider: infrastructure-nstance
{{- end }}

{{- define "nstance-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nstance-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Namespace the operator manages (NSTANCE_NAMESPACE). */}}
{{- define "nstance-operator.workNamespace" -}}
{{- default .Release.Namespace .Values.operator.namespace }}
{{- end }}

{{- define "nstance-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "nstance-operator.webhookServiceName" -}}
{{- printf "%s-webhook" (include "nstance-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nstance-operator.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "nstance-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "true" when the webhook certificate comes from cert-manager. */}}
{{- define "nstance-operator.useCertManager" -}}
{{- $mode := toString .Values.webhook.certManager }}
{{- if eq $mode "auto" }}
{{- .Capabilities.APIVersions.Has "cert-manager.io/v1" }}
{{- else }}
{{- eq $mode "true" }}
{{- end }}
{{- end }}

{{/* Directory the webhook certificate Secret is mounted at and passed as
  --webhook-cert-dir (controller-runtime's default). */}}
{{- define "nstance-operator.webhookCertDir" -}}
/tmp/k8s-webhook-server/serving-certs
{{- end }}
