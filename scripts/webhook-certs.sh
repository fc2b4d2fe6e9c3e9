#!/usr/bin/env bash
# Make a CA and a serving certificate for an operator that runs outside the cluster on loopback
# (the local cluster, the demo), and print the CA as the chart's webhook.caBundle.
# In a cluster the operator keeps its own (k8s/webhook_cert.py), or cert-manager does (webhook.certManager);
# the e2e suite has the host operator keep its own too (e2e/tests/conftest.py).
#
#   scripts/webhook-certs.sh DIR     -> DIR/{ca.crt,tls.crt,tls.key}; stdout: base64 of ca.crt
set -euo pipefail
dir=${1:?usage: webhook-certs.sh DIR}
mkdir -p "$dir"
if [[ ! -s $dir/tls.crt || ! -s $dir/ca.crt ]] || ! openssl x509 -checkend 86400 -noout -in "$dir/tls.crt" >/dev/null; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj "/CN=kimik3-webhook-ca" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$dir/ext.cnf"
  openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 30 \
    -extfile "$dir/ext.cnf" -out "$dir/tls.crt" 2>/dev/null
  chmod 600 "$dir/ca.key" "$dir/tls.key"
fi
base64 -w0 <"$dir/ca.crt"
echo
