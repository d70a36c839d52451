{{/* agent.lldpd (values.yaml): the host lldpd's socket read through --lldpd-socket. */}}

{{/* The host's _lldpd GID: required, a whole number, since without it connect() is refused. */}}
{{- define "hypertopo.lldpdGid" -}}
{{- $gid := .Values.agent.lldpd.gid -}}
{{- if kindIs "invalid" $gid -}}
{{- fail "agent.lldpd.gid: required with agent.lldpd.enabled: the host's _lldpd GID (`getent group _lldpd` on the nodes); lldpd's socket is srwxrwx--- _lldpd:_lldpd and the agent has no CAP_DAC_OVERRIDE" -}}
{{- end -}}
{{- if not (regexMatch "^[0-9]+$" (toString $gid)) -}}
{{- fail (printf "agent.lldpd.gid: %v is not a group ID (a whole number, `getent group _lldpd`)" $gid) -}}
{{- end -}}
{{- toString $gid -}}
{{- end }}

{{/* The socket's directory, mounted read-only at the same path; never a shared one like /run. */}}
{{- define "hypertopo.lldpdDir" -}}
{{- $socket := .Values.agent.lldpd.socket -}}
{{- if not (isAbs $socket) -}}
{{- fail (printf "agent.lldpd.socket: %q is not an absolute path on the node" $socket) -}}
{{- end -}}
{{- $dir := dir (clean $socket) -}}
{{- if has $dir (list "/" "/run" "/var/run" "/var" "/tmp") -}}
{{- fail (printf "agent.lldpd.socket: %s is in %s, which would be mounted whole (containerd's and other sockets with it); start lldpd with -u /run/lldpd/lldpd.socket and set that" $socket $dir) -}}
{{- end -}}
{{- $dir -}}
{{- end }}
