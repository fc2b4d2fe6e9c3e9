#!/usr/bin/env bash
# Write a kubeconfig that acts as a ServiceAccount: how the operator runs on the host (kwok runs
# no containers) with exactly the RBAC the chart grants it.
#   scripts/sa-kubeconfig.sh NAMESPACE SERVICEACCOUNT OUT [DURATION]
# Server and CA come from the current kubeconfig ($KUBECONFIG); the token from TokenRequest.
set -euo pipefail
ns=${1:?namespace}; sa=${2:?serviceaccount}; out=${3:?output path}; duration=${4:-12h}
server="$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.server}')"
ca="$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')"
ca_data="$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
token="$(kubectl -n "$ns" create token "$sa" --duration="$duration")"
umask 077
{
  echo "apiVersion: v1"
  echo "kind: Config"
  echo "clusters:"
  echo "- name: cluster"
  echo "  cluster:"
  echo "    server: $server"
  if [[ -n $ca_data ]]; then echo "    certificate-authority-data: $ca_data"; else echo "    certificate-authority: $ca"; fi
  echo "users:"
  echo "- name: $sa"
  echo "  user:"
  echo "    token: $token"
  echo "contexts:"
  echo "- name: $sa"
  echo "  context: {cluster: cluster, user: $sa, namespace: $ns}"
  echo "current-context: $sa"
} >"$out"
echo "$out"
