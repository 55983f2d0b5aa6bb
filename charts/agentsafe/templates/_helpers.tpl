{{/* Names, labels and the image reference shared by every template. */}}

{{- define "agentsafe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "agentsafe.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "agentsafe.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "agentsafe.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "agentsafe.operatorName" -}}
{{- printf "%s-operator" (include "agentsafe.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "agentsafe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "agentsafe.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator's pods carry app.kubernetes.io/name=agentsafe-operator: executors'
     NetworkPolicies admit the operator's halt calls by that label. */}}
{{- define "agentsafe.selectorLabels" -}}
app.kubernetes.io/name: agentsafe-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agentsafe.labels" -}}
{{ include "agentsafe.selectorLabels" . }}
app.kubernetes.io/part-of: agentsafe
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* A matchLabels map as the operator's key=value[,...] flag value, sorted by key. */}}
{{- define "agentsafe.labelList" -}}
{{- $pairs := list -}}
{{- range $key, $value := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{- define "agentsafe.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "agentsafe.executorImage" -}}
{{- default (include "agentsafe.image" .) .Values.executor.image -}}
{{- end -}}

{{/* Pod and container securityContext: values (restricted by default; keys set to null are
     dropped, so OpenShift's restricted-v2 can assign the UID), the same for the operator and
     the test pod. */}}
{{- define "agentsafe.podSecurityContext" -}}
{{- toYaml .Values.operator.podSecurityContext -}}
{{- end -}}

{{- define "agentsafe.containerSecurityContext" -}}
{{- toYaml .Values.operator.securityContext -}}
{{- end -}}

{{/* The admission webhook: its configuration's name (cluster-scoped), how its serving
     certificate is issued, and the Secrets that hold it. */}}
{{- define "agentsafe.webhookConfigurationName" -}}
{{- include "agentsafe.operatorName" . -}}
{{- end -}}

{{- define "agentsafe.webhookTlsMode" -}}
{{- $mode := .Values.webhook.tls.mode -}}
{{- if eq $mode "auto" -}}
{{- if .Capabilities.APIVersions.Has "cert-manager.io/v1" -}}certManager{{- else -}}operator{{- end -}}
{{- else -}}
{{- $mode -}}
{{- end -}}
{{- end -}}

{{- define "agentsafe.webhookCaSecretName" -}}
{{- printf "%s-webhook-ca" (include "agentsafe.operatorName" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "agentsafe.webhookCertificateName" -}}
{{- printf "%s-webhook" (include "agentsafe.operatorName" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "agentsafe.webhookTlsSecretName" -}}
{{- printf "%s-webhook-tls" (include "agentsafe.operatorName" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The DNS names the API server dials: the operator Service in the release namespace. */}}
{{- define "agentsafe.webhookDnsNames" -}}
{{- $service := include "agentsafe.operatorName" . -}}
- {{ printf "%s.%s.svc" $service .Release.Namespace }}
- {{ printf "%s.%s.svc.cluster.local" $service .Release.Namespace }}
{{- end -}}
