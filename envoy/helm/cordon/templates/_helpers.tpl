{{/* Labels every object carries. */}}
{{- define "cordon.labels" -}}
app.kubernetes.io/part-of: cordon
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{- define "cordon.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The pod-level security context of every Cordon pod (the restricted Pod Security Standard). */}}
{{- define "cordon.podSecurity" -}}
automountServiceAccountToken: false
securityContext:
  runAsNonRoot: true
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{- define "cordon.containerSecurity" -}}
securityContext:
  runAsUser: 10001
  runAsGroup: 10001
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities:
    drop: [ALL]
{{- end }}

{{/*
ext_proc. Takes (dict "root" $ "workers" N "admin" BOOL "native" BOOL "drain" BOOL "resources" R):
admin gives it ADMIN_TOKEN (the admin pods only); native makes it a native sidecar (an init
container with restartPolicy: Always); drain makes it outlive Envoy's drain on termination.
*/}}
{{- define "cordon.extProc" -}}
{{- $v := .root.Values -}}
- name: ext-proc
  image: {{ include "cordon.image" .root }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if .native }}
  restartPolicy: Always
  {{- end }}
  command: ["python", "-m", "ext_proc", "serve"]
  env:
    - name: WORKERS
      value: {{ .workers | quote }}
    # The pod IP, for the kubelet's gRPC probes and Prometheus; the NetworkPolicy keeps the gRPC
    # ports closed to other pods (Envoy reaches them over loopback).
    - name: EXTPROC_ADDRESS
      value: 0.0.0.0
    - name: EXTPROC_PORT
      value: {{ $v.ports.grpc | quote }}
    - name: METRICS_PORT
      value: {{ $v.ports.metrics | quote }}
    - name: POLICY_DIR
      value: /etc/cordon/policies
    - name: RUN_DIR
      value: /var/lib/cordon
    - name: MAX_BODY_BYTES
      value: {{ $v.maxBodyBytes | quote }}
    - name: TRUST_TENANT_HEADER
      value: {{ $v.trustTenantHeader | quote }}
    - name: LOG_LEVEL
      value: {{ $v.logLevel | quote }}
    - name: REDIS_URL
      valueFrom:
        secretKeyRef: {name: {{ $v.secrets.name }}, key: {{ $v.secrets.redisUrlKey }}}
    - name: RECEIPT_SECRET
      valueFrom:
        secretKeyRef: {name: {{ $v.secrets.name }}, key: RECEIPT_SECRET}
    {{- if .admin }}
    - name: ADMIN_TOKEN
      valueFrom:
        secretKeyRef: {name: {{ $v.secrets.name }}, key: ADMIN_TOKEN}
    {{- end }}
    - name: TENANT_SECRET
      valueFrom:
        secretKeyRef: {name: {{ $v.secrets.name }}, key: TENANT_SECRET, optional: true}
  # Worker i listens on ports.grpc + i.
  ports:
    {{- range $i := until (int .workers) }}
    - name: {{ if $i }}grpc-{{ $i }}{{ else }}grpc{{ end }}
      containerPort: {{ add $v.ports.grpc $i }}
    {{- end }}
    - name: metrics
      containerPort: {{ $v.ports.metrics }}
  # Worker 0's gRPC health (the supervisor restarts any worker that dies, and Envoy stops sending
  # to one that fails its own health check). Restarted only when it does not answer (`liveness`);
  # not Ready while Redis is down.
  startupProbe:
    grpc:
      port: {{ $v.ports.grpc }}
      service: liveness
    periodSeconds: 2
    failureThreshold: 30
  readinessProbe:
    grpc:
      port: {{ $v.ports.grpc }}
    periodSeconds: 5
  livenessProbe:
    grpc:
      port: {{ $v.ports.grpc }}
      service: liveness
    periodSeconds: 10
    failureThreshold: 3
  {{- if .drain }}
  lifecycle:
    preStop:
      exec:
        command: ["sleep", "30"] # outlive Envoy's drain (its preStop: 25 s)
  {{- end }}
  resources:
    {{- toYaml .resources | nindent 4 }}
  {{- include "cordon.containerSecurity" . | nindent 2 }}
  volumeMounts:
    - name: policies
      mountPath: /etc/cordon/policies
      readOnly: true
    - name: extproc-run
      mountPath: /var/lib/cordon
    - name: tmp
      mountPath: /tmp
{{- end }}

{{/*
Envoy, from the same image: it renders its bootstrap from its environment at start (the code of
`make run` and docker compose), then becomes Envoy. Takes (dict "root" $ "workers" N "native" BOOL
"drain" BOOL "resources" R).
*/}}
{{- define "cordon.envoy" -}}
{{- $v := .root.Values -}}
- name: envoy
  image: {{ include "cordon.image" .root }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if .native }}
  restartPolicy: Always
  {{- end }}
  # --concurrency: one Envoy thread per ext_proc worker (each thread spreads streams over them all).
  command:
    - sh
    - -c
    - >-
      python -m ext_proc bootstrap --output /var/lib/cordon/envoy.yaml
      && exec envoy -c /var/lib/cordon/envoy.yaml --concurrency {{ .workers }} --disable-hot-restart
      --drain-time-s 20 --log-level warn
  env:
    - name: LISTEN_ADDRESS
      value: 0.0.0.0
    - name: LISTEN_PORT
      value: {{ $v.ports.http | quote }}
    - name: TLS_PORT
      value: {{ $v.ports.https | quote }}
    - name: ENVOY_ADMIN_PORT
      value: {{ $v.ports.envoyAdmin | quote }}
    - name: EXTPROC_ADDRESS
      value: 127.0.0.1
    - name: EXTPROC_PORT
      value: {{ $v.ports.grpc | quote }}
    # ext_proc's: the bootstrap lists one endpoint per worker (EXTPROC_PORT + i).
    - name: WORKERS
      value: {{ .workers | quote }}
    - name: MAX_BODY_BYTES
      value: {{ $v.maxBodyBytes | quote }}
    - name: OPENAI_UPSTREAM
      value: {{ $v.upstreams.openai | quote }}
    - name: ANTHROPIC_UPSTREAM
      value: {{ $v.upstreams.anthropic | quote }}
    - name: RUN_DIR
      value: /var/lib/cordon
    - name: ENVOY_ACCESS_LOG
      value: /dev/stdout
    {{- if $v.tls.secretName }}
    - name: TLS_CERT_FILE
      value: /etc/cordon/tls/tls.crt
    - name: TLS_KEY_FILE
      value: /etc/cordon/tls/tls.key
    {{- end }}
  ports:
    - name: http
      containerPort: {{ $v.ports.http }}
    - name: https
      containerPort: {{ $v.ports.https }}
  # Probed on the plain listener: the admin port (and so /ready) is bound to 127.0.0.1. /readyz
  # is Ready only when a worker serves and its Redis answers.
  startupProbe:
    httpGet: {path: /healthz, port: http}
    periodSeconds: 2
    failureThreshold: 30
  readinessProbe:
    httpGet: {path: {{ $v.envoyReadinessPath }}, port: http}
    periodSeconds: 5
  livenessProbe:
    httpGet: {path: /healthz, port: http}
    periodSeconds: 10
    failureThreshold: 3
  {{- if .drain }}
  lifecycle:
    preStop:
      exec:
        command:
          - python
          - -c
          - "import time, urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:{{ $v.ports.envoyAdmin }}/drain_listeners?graceful', method='POST'), timeout=2); time.sleep(25)"
  {{- end }}
  resources:
    {{- toYaml .resources | nindent 4 }}
  {{- include "cordon.containerSecurity" . | nindent 2 }}
  volumeMounts:
    - name: envoy-run
      mountPath: /var/lib/cordon
    {{- if $v.tls.secretName }}
    - name: tls
      mountPath: /etc/cordon/tls
      readOnly: true
    {{- end }}
{{- end }}

{{/* The volumes of a pod running ext_proc and Envoy. */}}
{{- define "cordon.volumes" -}}
- name: policies
  configMap:
    name: {{ .Values.policies.name }}
{{- if .Values.tls.secretName }}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
{{- end }}
- name: extproc-run
  emptyDir: {}
- name: envoy-run
  emptyDir: {}
- name: tmp
  emptyDir: {}
{{- end }}

{{/* Egress rules (NetworkPolicyEgressRule items). */}}
{{- define "cordon.egress.dns" -}}
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ .Values.networkPolicy.dns.namespace }}
      podSelector:
        matchLabels:
          {{- toYaml .Values.networkPolicy.dns.podLabels | nindent 10 }}
  ports:
    - protocol: UDP
      port: 53
    - protocol: TCP
      port: 53
{{- end }}

{{- define "cordon.egress.upstreams" -}}
- to:
    {{- range .Values.networkPolicy.upstreams.ipBlocks }}
    - ipBlock:
        {{- toYaml . | nindent 8 }}
    {{- end }}
  ports:
    {{- range .Values.networkPolicy.upstreams.ports }}
    - protocol: TCP
      port: {{ . }}
    {{- end }}
{{- end }}

{{- define "cordon.egress.redis" -}}
{{- if .Values.redis.deploy }}
- to:
    - podSelector:
        matchLabels:
          app.kubernetes.io/name: cordon-redis
  ports:
    - protocol: TCP
      port: {{ .Values.redis.port }}
{{- else if .Values.redis.external.cidrs }}
- to:
    {{- range .Values.redis.external.cidrs }}
    - ipBlock:
        cidr: {{ . }}
    {{- end }}
  ports:
    - protocol: TCP
      port: {{ .Values.redis.port }}
{{- else }}
{{- fail "redis.deploy is false: list the Redis addresses in redis.external.cidrs (the NetworkPolicies let out nothing else)" }}
{{- end }}
{{- end }}
