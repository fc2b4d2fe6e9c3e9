{{- /*
The webhook's certificate, one of three ways:
- cert-manager (webhook.certManager.enabled): a Certificate into the Secret <fullname>-webhook-tls,
  mounted into the pods (the operator reloads it when cert-manager renews it); cert-manager's
  cainjector sets the caBundle.
- given (webhook.url with webhook.caBundle): an operator outside the cluster with a certificate of
  its own; the chart writes the caBundle.
- the operator's (otherwise): the operator makes a CA and serving certificate into the Secret
  <fullname>-webhook-cert, renews them, and sets the caBundle itself (k8s/webhook_cert_keeper.py). The
  chart renders no key material, so `helm template` gives the same output every time.
*/ -}}

{{- define "kimik3-operator.webhook.service" -}}
{{- printf "%s-webhook" (include "kimik3-operator.fullname" .) }}
{{- end }}

{{- define "kimik3-operator.webhook.tlsSecret" -}}
{{- printf "%s-webhook-tls" (include "kimik3-operator.fullname" .) }}
{{- end }}

{{- define "kimik3-operator.webhook.certSecret" -}}
{{- printf "%s-webhook-cert" (include "kimik3-operator.fullname" .) }}
{{- end }}

{{- /* "true" when the operator keeps the certificate (an empty string is false in `if`) */ -}}
{{- define "kimik3-operator.webhook.operatorCert" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) (not .Values.webhook.caBundle) }}true{{ end }}
{{- end }}

{{- define "kimik3-operator.webhook.check" -}}
{{- if and .Values.webhook.certManager.enabled .Values.webhook.url }}
{{- fail "webhook.certManager serves the in-cluster Service: leave webhook.url empty" }}
{{- end }}
{{- if and .Values.webhook.caBundle (not .Values.webhook.url) }}
{{- fail "webhook.caBundle goes with webhook.url (in the cluster the operator or cert-manager keeps the certificate)" }}
{{- end }}
{{- end }}

{{- /* The operator's webhook flags, when it serves the webhook in the cluster. */ -}}
{{- define "kimik3-operator.webhook.args" -}}
{{- $service := include "kimik3-operator.webhook.service" . -}}
- --webhook-port={{ .Values.webhook.port }}
{{- if .Values.webhook.certManager.enabled }}
- --webhook-cert=/etc/kimik3/webhook/tls.crt
- --webhook-key=/etc/kimik3/webhook/tls.key
{{- else }}
- --webhook-cert-secret={{ include "kimik3-operator.webhook.certSecret" . }}
- --webhook-configuration={{ include "kimik3-operator.fullname" . }}
- --webhook-cert-host={{ $service }}
- --webhook-cert-host={{ $service }}.{{ .Release.Namespace }}
- --webhook-cert-host={{ $service }}.{{ .Release.Namespace }}.svc
{{- end }}
{{- end }}
