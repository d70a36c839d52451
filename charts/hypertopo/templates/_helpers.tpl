{{/* The container image: repository and tag (the chart's appVersion unless set). */}}
{{- define "hypertopo.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Extra `- arg` lines after the manifests' own arguments. */}}
{{- define "hypertopo.extraArgs" -}}
{{- range . }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{- define "hypertopo.agentArgs" -}}
{{- include "hypertopo.extraArgs" .Values.agent.extraArgs }}
{{- end }}

{{- define "hypertopo.schedulerArgs" -}}
{{- include "hypertopo.extraArgs" .Values.scheduler.extraArgs }}
{{- end }}

{{- define "hypertopo.aggregatorArgs" -}}
{{- with .Values.aggregator }}
{{- if .nodeLabels }}
- --node-labels
{{- end }}
{{- if .taintUnhealthy }}
- --taint-unhealthy
{{- end }}
{{- if .markDegraded }}
- --mark-degraded
{{- end }}
{{- if not (kindIs "invalid" .readyThreshold) }}
- --ready-threshold={{ .readyThreshold }}
{{- end }}
{{- if not (kindIs "invalid" .degradedThreshold) }}
- --degraded-threshold={{ .degradedThreshold }}
{{- end }}
{{- if not (kindIs "invalid" .holdDown) }}
- --hold-down={{ .holdDown }}
{{- end }}
{{- include "hypertopo.extraArgs" .extraArgs }}
{{- end }}
{{- end }}
