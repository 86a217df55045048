{{- define "mgrpo.fullname" -}}{{ printf "%s-mgrpo" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "mgrpo.labels" -}}
app.kubernetes.io/name: mgrpo
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "mgrpo.secretName" -}}{{ .Values.existingSecret | default (printf "%s-token" (include "mgrpo.fullname" .)) }}{{- end -}}
{{- define "mgrpo.redisUrl" -}}
{{- if .Values.redis.enabled -}}redis://{{ include "mgrpo.fullname" . }}-redis:6379/0{{- else -}}{{ required "redis.url is required when redis.enabled is false" .Values.redis.url }}{{- end -}}
{{- end -}}
{{- define "mgrpo.probes" -}}
readinessProbe:
  httpGet: {path: /readyz, port: http}
  periodSeconds: 10
livenessProbe:
  httpGet: {path: /healthz, port: http}
  initialDelaySeconds: 30
  periodSeconds: 15
{{- end -}}
{{- define "mgrpo.roleUrls" -}}
{{- $urls := dict -}}
{{- range .Values.roles -}}{{- if ne .kind "planner" -}}{{- $_ := set $urls .name (printf "http://%s-%s:%v" (include "mgrpo.fullname" $) .name .port) -}}{{- end -}}{{- end -}}
{{- toJson $urls -}}
{{- end -}}
