{{/* Names ------------------------------------------------------------------------------------ */}}

{{- define "nodewarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* `<release>-<chart>`, or the release name alone when it already holds the chart name. Kept to
     45 characters so that `<fullname>-validating` and the other suffixed names stay within 63. */}}
{{- define "nodewarden.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "nodewarden.webhook.fullname" -}}
{{- printf "%s-webhook" (include "nodewarden.fullname" .) -}}
{{- end -}}

{{- define "nodewarden.agent.fullname" -}}
{{- printf "%s-agent" (include "nodewarden.fullname" .) -}}
{{- end -}}

{{- define "nodewarden.mutatingConfigName" -}}
{{- printf "%s-mutating" (include "nodewarden.fullname" .) -}}
{{- end -}}

{{- define "nodewarden.validatingConfigName" -}}
{{- printf "%s-validating" (include "nodewarden.fullname" .) -}}
{{- end -}}

{{- define "nodewarden.webhook.serviceAccountName" -}}
{{- if .Values.webhook.serviceAccount.create -}}
{{- default (include "nodewarden.webhook.fullname" .) .Values.webhook.serviceAccount.name -}}
{{- else -}}
{{- required "webhook.serviceAccount.name is required when webhook.serviceAccount.create is false" .Values.webhook.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "nodewarden.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create -}}
{{- default (include "nodewarden.agent.fullname" .) .Values.agent.serviceAccount.name -}}
{{- else -}}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the webhook's serving certificate (tls.crt, tls.key). */}}
{{- define "nodewarden.tlsSecretName" -}}
{{- if eq .Values.certificates.mode "secret" -}}
{{- .Values.certificates.secret.name -}}
{{- else -}}
{{- printf "%s-webhook-tls" (include "nodewarden.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Labels -------------------------------------------------------------------------------------- */}}

{{- define "nodewarden.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "nodewarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nodewarden
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "nodewarden.webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nodewarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "nodewarden.agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nodewarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "nodewarden.webhook.labels" -}}
{{ include "nodewarden.labels" . }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "nodewarden.agent.labels" -}}
{{ include "nodewarden.labels" . }}
app.kubernetes.io/component: agent
{{- end -}}

{{/* Images: `[registry/]repository@digest` when a digest is given, else `[registry/]repository:tag`
     (tag defaults to the chart's appVersion). The registry is the image's own, else
     global.imageRegistry, which is left out when the repository names its own host (its first
     part holds a `.` or `:`, or is `localhost`, as container runtimes read a reference).
     Call with (dict "image" .Values.x.image "root" $). */}}
{{- define "nodewarden.image" -}}
{{- $img := .image -}}
{{- $repo := $img.repository -}}
{{- $first := index (splitList "/" $repo) 0 -}}
{{- $hasHost := and (contains "/" $repo) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $global := ternary "" (dig "imageRegistry" "" (.root.Values.global | default dict)) $hasHost -}}
{{- with (default $global $img.registry) -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" .) $repo -}}
{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion $img.tag | toString) -}}
{{- end -}}
{{- end -}}

{{/* Webhook configurations ------------------------------------------------------------------------ */}}

{{/* Whether each webhook configuration has at least one entry. */}}
{{- define "nodewarden.mutatingEnabled" -}}
{{- if .Values.rightsizing.enabled -}}true{{- end -}}
{{- end -}}

{{- define "nodewarden.validatingEnabled" -}}
{{- if or .Values.claims.enabled .Values.autoscalers.enabled .Values.nodeReports.enabled .Values.features.enabled -}}true{{- end -}}
{{- end -}}

{{/* Comma-separated names of the webhook configurations this release renders; the webhook keeps their
     caBundle current in managed mode. */}}
{{- define "nodewarden.webhookConfigurations" -}}
{{- $names := list -}}
{{- if include "nodewarden.mutatingEnabled" . -}}
{{- $names = append $names (include "nodewarden.mutatingConfigName" .) -}}
{{- end -}}
{{- if include "nodewarden.validatingEnabled" . -}}
{{- $names = append $names (include "nodewarden.validatingConfigName" .) -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/* The caBundle, base64-encoded PEM, in secret mode (accepts PEM or base64 PEM in the value). */}}
{{- define "nodewarden.caBundle" -}}
{{- $ca := .Values.certificates.secret.caBundle | trim -}}
{{- if hasPrefix "-----BEGIN" $ca -}}
{{- $ca | b64enc -}}
{{- else -}}
{{- $ca | replace "\n" "" -}}
{{- end -}}
{{- end -}}

{{/* Annotations of both webhook configurations: webhookConfigurations.annotations, and
     cert-manager's injection annotation in certManager mode (the chart's wins). */}}
{{- define "nodewarden.webhookConfigAnnotations" -}}
{{- $annotations := deepCopy (.Values.webhookConfigurations.annotations | default dict) -}}
{{- if eq .Values.certificates.mode "certManager" -}}
{{- $_ := set $annotations "cert-manager.io/inject-ca-from" (printf "%s/%s" .Release.Namespace (include "nodewarden.tlsSecretName" .)) -}}
{{- end -}}
{{- with $annotations -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* imagePullSecrets of a pod: the chart-wide ones, then the component's own. Call with
     (dict "own" .Values.webhook.imagePullSecrets "root" $). */}}
{{- define "nodewarden.imagePullSecrets" -}}
{{- $all := concat (.root.Values.imagePullSecrets | default list) (.own | default list) | uniq -}}
{{- with $all -}}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* A probe's settings besides its handler: periodSeconds, and the probe's values
     (timeoutSeconds, failureThreshold, initialDelaySeconds when set). Call with
     (dict "period" .Values.webhook.probePeriodSeconds "probe" .Values.webhook.livenessProbe). */}}
{{- define "nodewarden.probeSettings" -}}
periodSeconds: {{ .period }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- with .probe.initialDelaySeconds }}
initialDelaySeconds: {{ . }}
{{- end }}
{{- end -}}

{{/* clientConfig of one webhook entry. Call with (dict "root" $ "path" "/validate/claims"). */}}
{{- define "nodewarden.clientConfig" -}}
{{- $root := .root -}}
clientConfig:
  service:
    name: {{ include "nodewarden.webhook.fullname" $root }}
    namespace: {{ $root.Release.Namespace }}
    path: {{ .path }}
    port: {{ $root.Values.webhook.service.port }}
  {{- if eq $root.Values.certificates.mode "secret" }}
  caBundle: {{ include "nodewarden.caBundle" $root }}
  {{- end }}
{{- end -}}

{{/* Seconds (a float) of a duration in the schema's syntax, e.g. `1m30s`, `500ms`. */}}
{{- define "nodewarden.seconds" -}}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" (toString .) -1 -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . -}}
{{- $total = addf $total (mulf (float64 $number) (get $units (trimPrefix $number .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* Checks that schema validation cannot express, with messages that say what to set. */}}
{{- define "nodewarden.validate" -}}
{{- if eq .Values.certificates.mode "secret" -}}
{{- if not .Values.certificates.secret.name -}}
{{- fail "certificates.mode is \"secret\" but certificates.secret.name is empty: set it to an existing kubernetes.io/tls Secret (keys tls.crt, tls.key) in the release namespace, or use certificates.mode=managed" -}}
{{- end -}}
{{- $ca := .Values.certificates.secret.caBundle | trim -}}
{{- if not $ca -}}
{{- fail "certificates.mode is \"secret\" but certificates.secret.caBundle is empty: set it to the CA certificate (PEM or base64-encoded PEM) that signed the certificate in the Secret, or use certificates.mode=managed" -}}
{{- end -}}
{{- if not (hasPrefix "-----BEGIN" $ca) -}}
{{- if not (hasPrefix "-----BEGIN" (b64dec ($ca | replace "\n" ""))) -}}
{{- fail "certificates.secret.caBundle is neither a PEM certificate nor base64-encoded PEM: it must start with -----BEGIN CERTIFICATE----- before or after base64 decoding" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.agent.kubelet.insecureSkipVerify .Values.agent.kubelet.caFile -}}
{{- fail "agent.kubelet.caFile is set but agent.kubelet.insecureSkipVerify is true, so the CA would never be used: keep the caFile and set insecureSkipVerify=false (verified), or empty the caFile" -}}
{{- end -}}
{{- with .Values.webhook.clientAuth -}}
{{- if and .enabled (not .caSecret) (not .caConfigMap) -}}
{{- fail "webhook.clientAuth.enabled is true but neither webhook.clientAuth.caSecret nor webhook.clientAuth.caConfigMap names the CA that signs the API server's client certificate: set one of them" -}}
{{- end -}}
{{- if and .caSecret .caConfigMap -}}
{{- fail "webhook.clientAuth.caSecret and webhook.clientAuth.caConfigMap are both set: keep one of them" -}}
{{- end -}}
{{- end -}}
{{- if .Values.checkApiVersions -}}
{{- $apis := list -}}
{{- if .Values.serviceMonitor.enabled -}}{{- $apis = append $apis (list "serviceMonitor.enabled" "monitoring.coreos.com/v1" "ServiceMonitor" "the Prometheus Operator's CRDs") -}}{{- end -}}
{{- if .Values.prometheusRule.enabled -}}{{- $apis = append $apis (list "prometheusRule.enabled" "monitoring.coreos.com/v1" "PrometheusRule" "the Prometheus Operator's CRDs") -}}{{- end -}}
{{- if eq .Values.certificates.mode "certManager" -}}{{- $apis = append $apis (list "certificates.mode=certManager" "cert-manager.io/v1" "Certificate" "cert-manager's CRDs") -}}{{- end -}}
{{- range $apis -}}
{{- $value := index . 0 -}}{{- $gv := index . 1 -}}{{- $kind := index . 2 -}}{{- $what := index . 3 -}}
{{- if not ($.Capabilities.APIVersions.Has $gv) -}}
{{- $off := ternary "certificates.mode=managed" (printf "%s=false" $value) (eq $value "certificates.mode=certManager") -}}
{{- fail (printf "%s asks for a %s but the cluster does not serve %s (%s are not installed): install them first, or set %s. With helm template, pass --api-versions %s; where the CRDs come with the same release, set checkApiVersions=false" $value $kind $gv $what $off $gv) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $key, $d := .Values.webhook.timeouts -}}
{{- if and $d (lt (include "nodewarden.seconds" $d | float64) 0.1) -}}
{{- fail (printf "webhook.timeouts.%s is %s: the webhook refuses timeouts under 100ms and would not start; use e.g. 500ms or 10s, or null for its default" $key $d) -}}
{{- end -}}
{{- end -}}
{{- with .Values.webhook -}}
{{- $drain := addf (include "nodewarden.seconds" .shutdownDelay | float64) (include "nodewarden.seconds" .shutdownGrace | float64) -}}
{{- $least := add (ceil $drain | int) 2 -}}
{{- if lt (int .terminationGracePeriodSeconds) $least -}}
{{- fail (printf "webhook.terminationGracePeriodSeconds is %d but webhook.shutdownDelay (%s) + webhook.shutdownGrace (%s) take up to %gs, and the kubelet kills the pod when the period ends: set terminationGracePeriodSeconds to at least %d (2s to exit), or shorten the delay or the grace" (int .terminationGracePeriodSeconds) .shutdownDelay .shutdownGrace $drain $least) -}}
{{- end -}}
{{- end -}}
{{- if eq (int .Values.webhook.port) (int .Values.webhook.adminPort) -}}
{{- fail (printf "webhook.port and webhook.adminPort are both %d: the admission and admin servers need a port each" (int .Values.webhook.port)) -}}
{{- end -}}
{{- with .Values.agent.updateStrategy -}}
{{- $zero := list "0" "0%" -}}
{{- $surge := not (has (toString (.maxSurge | default 0)) $zero) -}}
{{- $unavailable := not (has (toString .maxUnavailable) $zero) -}}
{{- if and $surge $unavailable -}}
{{- fail (printf "agent.updateStrategy.maxSurge is %v and agent.updateStrategy.maxUnavailable is %v: a DaemonSet takes one of them, the other must be 0; set agent.updateStrategy.maxUnavailable=0 to surge" .maxSurge .maxUnavailable) -}}
{{- end -}}
{{- if and (not $surge) (not $unavailable) -}}
{{- fail "agent.updateStrategy.maxSurge and agent.updateStrategy.maxUnavailable are both 0: a rollout could never replace an agent; set one of them (e.g. maxUnavailable=10%)" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.certificates.certManager.issuerRef (ne .Values.certificates.mode "certManager") -}}
{{- fail "certificates.certManager.issuerRef is set but certificates.mode is not \"certManager\": set certificates.mode=certManager to use it, or remove the issuerRef" -}}
{{- end -}}
{{- end -}}
