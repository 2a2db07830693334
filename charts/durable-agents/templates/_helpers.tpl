{{- define "durable-agents.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "durable-agents.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The Secret holding the sealing and stamping keys: the user's, or the one the chart creates. */}}
{{- define "durable-agents.keysSecret" -}}
{{- .Values.sealing.secretName | default (printf "%s-keys" (include "durable-agents.fullname" .)) -}}
{{- end -}}

{{- define "durable-agents.activeKey" -}}
{{- if .Values.sealing.secretName -}}
{{- required "sealing.activeKey names the key that seals (with sealing.secretName)" .Values.sealing.activeKey -}}
{{- else -}}
{{- .Values.sealing.activeKey | default "key-1" -}}
{{- end -}}
{{- end -}}

{{- define "durable-agents.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "durable-agents.webhookService" -}}
{{- printf "%s-webhook" (include "durable-agents.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "durable-agents.webhookSecret" -}}
{{- printf "%s-tls" (include "durable-agents.webhookService" .) -}}
{{- end -}}

{{/* One pair of webhook configurations per cluster (or per watched namespace). */}}
{{- define "durable-agents.webhookConfiguration" -}}
{{- if .Values.webhook.configurationName -}}
{{- .Values.webhook.configurationName -}}
{{- else if .Values.watchNamespace -}}
{{- printf "durable-agents-%s" .Values.watchNamespace -}}
{{- else -}}
durable-agents
{{- end -}}
{{- end -}}

{{- define "durable-agents.metricsService" -}}
{{- printf "%s-metrics" (include "durable-agents.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
