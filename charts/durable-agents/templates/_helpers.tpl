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

{{/* The image reference: repository:tag, and @digest when image.digest pins it (what runs is then
exactly the digest, whatever the tag says now). */}}
{{- define "durable-agents.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{ with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/* checkov's skips for the operator's and the console's Deployments, each with its reason (make
lint scans the rendered chart: docs/security/supply-chain.md, "The chart scan"). Called with
(dict "root" $ "token" true) where the Pod mounts its ServiceAccount token. */}}
{{- define "durable-agents.scanSkips" -}}
{{- $v := .root.Values -}}
checkov.io/skip1: CKV_K8S_11=no CPU limit by default - CFS throttling delays Lease renewals and webhook answers and a missed renewal fences the replica; resources.limits.cpu caps it
{{- if .token }}
checkov.io/skip2: CKV_K8S_38=the operator calls the API server as its ServiceAccount - it needs the token
{{- end }}
{{- if ne $v.image.pullPolicy "Always" }}
checkov.io/skip3: CKV_K8S_15=image.pullPolicy {{ $v.image.pullPolicy }} - the default image is built on the node by make image with no registry to pull from; set Always with a registry
{{- end }}
{{- if not $v.image.digest }}
checkov.io/skip4: CKV_K8S_43=image.digest unset - pinned by tag only; set image.digest to run exactly one build
{{- end }}
{{- end }}
