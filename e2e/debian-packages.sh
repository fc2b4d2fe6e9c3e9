# shellcheck shell=bash
# ensure_debian_packages LOG PACKAGE...: install the Debian packages that are missing (the e2e's
# real node, registry and image builds use Debian 12's), once more after `apt-get update` when the
# package lists are missing or stale, as on a fresh machine. Fails with the log's tail.
ensure_debian_packages() {
  local log=$1 missing=() p
  shift
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  printf '[debian] installing %s\n' "${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Another apt-get (the cluster build downloads Prometheus's package) may hold the lock a moment.
  local install=(apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends "${missing[@]}")
  # No package may start its service (docker-registry's would listen on *:5000 on a systemd
  # machine): a policy-rc.d that refuses every start, for the length of the install, if none is there.
  local policy=/usr/sbin/policy-rc.d ours=0 rc=0
  if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && ours=1; fi
  { "${install[@]}" || { apt-get -o DPkg::Lock::Timeout=300 update && "${install[@]}"; }; } >"$log" 2>&1 || rc=$?
  ((ours)) && rm -f "$policy"
  if ((rc != 0)); then
    tail -n 20 "$log" >&2
    printf '[debian] FAILED: apt-get install %s (log %s)\n' "${missing[*]}" "$log" >&2
    return 1
  fi
}
