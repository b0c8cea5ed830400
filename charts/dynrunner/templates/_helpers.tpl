{{/* Names: <release>-dynrunner unless the release name already says dynrunner. */}}
{{- define "dynrunner.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dynrunner.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dynrunner.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "dynrunner.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: controller, nats, cache. */}}
{{- define "dynrunner.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dynrunner.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dynrunner.componentLabels" -}}
{{ include "dynrunner.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dynrunner.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-controller" (include "dynrunner.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dynrunner.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "dynrunner.executorNamespace" -}}
{{- default (printf "%s-jobs" .Release.Namespace) .Values.executorNamespace.name -}}
{{- end -}}

{{/* The Secret the chart keeps its own secrets in (inline values and generated keys). */}}
{{- define "dynrunner.secretName" -}}
{{- include "dynrunner.fullname" . -}}
{{- end -}}

{{- define "dynrunner.natsUrl" -}}
{{- if .Values.nats.url -}}
{{- .Values.nats.url -}}
{{- else -}}
{{- printf "nats://%s-nats.%s.svc:4222" (include "dynrunner.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{- define "dynrunner.cacheUrl" -}}
{{- printf "http://%s-cache.%s.svc:%d" (include "dynrunner.fullname" .) .Release.Namespace (int .Values.cache.port) -}}
{{- end -}}

{{/* Where the configuration and every secret file are mounted (one projected volume). */}}
{{- define "dynrunner.configDir" -}}/etc/dynrunner{{- end -}}

{{/*
The pools as the controller reads them: every pool's backend defaults to kind kubernetes, and a
kubernetes backend is merged over kubernetesDefaults, the executor namespace and image; an
opensandbox backend with a key in openSandbox.apiKeys reads it where the chart mounts it.
Returns YAML: {pools: [...]}.
*/}}
{{- define "dynrunner.pools" -}}
{{- $image := printf "%s:%s" .Values.executorImage.repository (default .Chart.AppVersion .Values.executorImage.tag) -}}
{{- $base := dict "kind" "kubernetes" "namespace" (include "dynrunner.executorNamespace" .) "image" $image -}}
{{- $pools := list -}}
{{- range .Values.config.pools -}}
{{- $pool := deepCopy . -}}
{{- $backend := deepCopy (default (dict) $pool.backend) -}}
{{- if eq (default "kubernetes" $backend.kind) "kubernetes" -}}
{{- $backend = mergeOverwrite (deepCopy $base) (deepCopy $.Values.kubernetesDefaults) $backend -}}
{{- else if and (eq $backend.kind "opensandbox") (hasKey (default dict $.Values.openSandbox.apiKeys) $pool.name) -}}
{{- if $backend.apiKeyFile -}}
{{- fail (printf "pool %s: set openSandbox.apiKeys.%s or backend.apiKeyFile, not both" $pool.name $pool.name) -}}
{{- end -}}
{{- $_ := set $backend "apiKeyFile" (printf "%s/%s" (include "dynrunner.configDir" $) (include "dynrunner.apiKeyPath" $pool.name)) -}}
{{- end -}}
{{- $_ := set $pool "backend" $backend -}}
{{- $pools = append $pools $pool -}}
{{- end -}}
{{- toYaml (dict "pools" $pools) -}}
{{- end -}}

{{/* The namespaces of kubernetes pools, sorted, as YAML {namespaces: [...]}. */}}
{{- define "dynrunner.jobNamespaces" -}}
{{- $namespaces := list -}}
{{- range (include "dynrunner.pools" . | fromYaml).pools -}}
{{- if eq .backend.kind "kubernetes" -}}
{{- $namespaces = append $namespaces .backend.namespace -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "namespaces" ($namespaces | uniq | sortAlpha)) -}}
{{- end -}}

{{/* The pool names of kubernetes pools in namespace .namespace, as YAML {pools: [...]}. */}}
{{- define "dynrunner.poolsIn" -}}
{{- $names := list -}}
{{- range (include "dynrunner.pools" .root | fromYaml).pools -}}
{{- if and (eq .backend.kind "kubernetes") (eq .backend.namespace $.namespace) -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "pools" $names) -}}
{{- end -}}

{{/*
A secret value {value, existingSecret, key} as a projected-volume source: the chart's Secret
(for a value) or the existing one, its key shown as file .path. Empty when neither is set.
*/}}
{{- define "dynrunner.secretSource" -}}
{{- $s := .secret -}}
{{- if or $s.value $s.existingSecret -}}
- secret:
    name: {{ ternary (include "dynrunner.secretName" .root) $s.existingSecret (empty $s.existingSecret) }}
    items:
      - key: {{ ternary .chartKey $s.key (empty $s.existingSecret) }}
        path: {{ .path }}
{{- end -}}
{{- end -}}

{{- define "dynrunner.checkSecret" -}}
{{- if and .secret.value .secret.existingSecret -}}
{{- fail (printf "%s: set value or existingSecret, not both" .name) -}}
{{- end -}}
{{- end -}}

{{/* host:port of a URL → the port (default by scheme). */}}
{{- define "dynrunner.urlPort" -}}
{{- $u := urlParse . -}}
{{- $host := $u.host -}}
{{- if regexMatch ":[0-9]+$" $host -}}
{{- regexFind "[0-9]+$" $host -}}
{{- else if eq $u.scheme "https" -}}443
{{- else -}}80
{{- end -}}
{{- end -}}

{{/*
The bundled nats-server's configuration. The controller's password is read from the server's
environment (DYNRUNNER_NATS_PASSWORD, from the Secret that holds it), so the file holds no
secret and works with an existing Secret the chart cannot read. The controller's user may
publish and subscribe only where docs/configuration.md#nats says.
*/}}
{{- define "dynrunner.natsConf" -}}
{{- $root := .root -}}
{{- $nats := default dict $root.Values.config.nats -}}
{{- $prefix := default "dynrunner.assignments" $nats.subjectPrefix -}}
{{- /* The buckets of active/active replicas (leases, permits) are granted ahead of their config keys. */ -}}
{{- $subscribe := list (printf "%s.>" $prefix) "$JS.API.>" (printf "$KV.%s.>" (default "DYNRUNNER_REGISTRATIONS" $nats.registrationsBucket)) (printf "$KV.%s.>" (default "DYNRUNNER_LAUNCHED" $nats.launchedBucket)) (printf "$KV.%s.>" (default "DYNRUNNER_FINALIZE" $nats.finalizeBucket)) (printf "$KV.%s.>" (default "DYNRUNNER_REPLICAS" $nats.replicasBucket)) (printf "$KV.%s.>" (default "DYNRUNNER_PERMITS" $nats.permitsBucket)) "_INBOX.>" -}}
{{- $publish := append $subscribe (printf "$JS.ACK.%s.>" (default "DYNRUNNER_ASSIGNMENTS" $nats.stream)) -}}
# The bundled nats-server of the dynrunner chart: one JetStream server for trying dynrunner out.
server_name: {{ include "dynrunner.fullname" $root }}-nats-0
listen: 0.0.0.0:4222
http: 0.0.0.0:8222
# Assignments up to config.nats.maxMessageBytes.
max_payload: {{ int64 (default 8388608 $nats.maxMessageBytes) }}
# The store directory is given on the command line (the StatefulSet's volume).
jetstream {
  max_file_store: {{ .maxFileStore }}
}
authorization {
  users: [
    {
      user: dynrunner
      password: $DYNRUNNER_NATS_PASSWORD
      permissions: {
        publish: [{{ range $i, $s := $publish }}{{ if $i }}, {{ end }}{{ $s | quote }}{{ end }}]
        subscribe: [{{ range $i, $s := $subscribe }}{{ if $i }}, {{ end }}{{ $s | quote }}{{ end }}]
      }
    }
  ]
}
{{- end -}}

{{/*
JetStream's file store limit for the bundled server: 90 % of its volume (nats.bundled.storage.size,
a Kubernetes quantity in Ki/Mi/Gi/Ti or plain bytes), so the server refuses new messages before
the disk is full.
*/}}
{{- define "dynrunner.natsMaxFileStore" -}}
{{- $size := .Values.nats.bundled.storage.size | toString -}}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- $number := regexFind "^[0-9]+" $size -}}
{{- $unit := trimPrefix $number $size -}}
{{- if not (or (hasKey $units $unit) (eq $unit "")) -}}
{{- fail (printf "nats.bundled.storage.size: %q is not a whole number of bytes, K, M, G, T, Ki, Mi, Gi or Ti" $size) -}}
{{- end -}}
{{- div (mul (int64 $number) (int64 (get $units $unit | default 1))) 10 | mul 9 -}}
{{- end -}}

{{/*
Where the bundled NATS server's password is: {name, key} of the chart's Secret (generated and
kept) or of nats.bundled.password.existingSecret.
*/}}
{{- define "dynrunner.natsPasswordRef" -}}
{{- $p := .Values.nats.bundled.password -}}
{{- if $p.existingSecret -}}
{{- toYaml (dict "name" $p.existingSecret "key" $p.key) -}}
{{- else -}}
{{- toYaml (dict "name" (include "dynrunner.secretName" .) "key" "nats-password") -}}
{{- end -}}
{{- end -}}

{{/*
The bundled NATS server's generated password, base64: the installed Secret's (an upgrade keeps
it), or a new one (the first install; every render without a cluster).
*/}}
{{- define "dynrunner.natsGeneratedPassword" -}}
{{- $memo := .Values.nats.bundled -}}
{{- if not (hasKey $memo "_generatedPassword") -}}
{{- /* Kept for the render's other templates: the Secret and both checksums see one password. */ -}}
{{- $previous := (lookup "v1" "Secret" .Release.Namespace (include "dynrunner.secretName" .)).data | default dict -}}
{{- $_ := set $memo "_generatedPassword" (index $previous "nats-password" | default (randAlphaNum 40 | b64enc)) -}}
{{- end -}}
{{- get $memo "_generatedPassword" -}}
{{- end -}}

{{/*
What the bundled NATS password's checksum covers, for the Pods that use it (the server and the
controllers restart together when it changes): the generated password (random, so its hash
gives nothing away), or the existing Secret's name and key (its content is not the chart's to
see: restart both after changing it).
*/}}
{{- define "dynrunner.natsPasswordChecksum" -}}
{{- $p := .Values.nats.bundled.password -}}
{{- if $p.existingSecret -}}
{{- printf "%s/%s" $p.existingSecret $p.key | sha256sum -}}
{{- else -}}
{{- include "dynrunner.natsGeneratedPassword" . | sha256sum -}}
{{- end -}}
{{- end -}}

{{/* Where pool .'s OpenSandbox API key is mounted, below the configuration directory. */}}
{{- define "dynrunner.apiKeyPath" -}}opensandbox/{{ . }}.key{{- end -}}

{{/* identity.spireServer's files: {config key: [values key, path below the configuration directory]}. */}}
{{- define "dynrunner.spireServerFiles" -}}
certFile: [certKey, spire/admin.crt]
keyFile: [keyKey, spire/admin.key]
bundleFile: [bundleKey, spire/bundle.crt]
{{- end -}}
