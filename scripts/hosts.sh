#!/usr/bin/env bash
# Test hosts on one machine: K network namespaces, each a "host" with its own address and host
# name, joined by veth pairs to a bridge that lives in a namespace of its own (the "switch").
# Nothing is configured outside these namespaces. Needs root (ip netns, veth, bridge, tc).
#
#   scripts/hosts.sh up K [RATE]   make hosts fsdph0..fsdph{K-1} (198.18.0.1..K/24), the hostfile
#                                  and the launch agent; RATE (e.g. 1gbit) limits every host's link
#                                  with a tbf qdisc on both ends of its veth pair
#   scripts/hosts.sh down          remove every namespace, link and file that `up` made
#   scripts/hosts.sh exec H CMD... run CMD inside host H (its namespace and its own host name)
#   scripts/hosts.sh counters      "host rx_bytes tx_bytes" of each host's link, one line per host
#   scripts/hosts.sh check         exit 0 when this machine can make test hosts, else 77 and why
#
# Addresses come from 198.18.0.0/15 (RFC 2544, set aside for network benchmark tests), so they can
# never collide with a real network. Environment: FSDP_HOSTS_PREFIX (namespace and host name
# prefix, default fsdph), FSDP_HOSTS_DIR (hostfile and agent, default /tmp/<prefix>).
#
# Launch (docs/multi_host.md): mpirun runs inside host 0 and starts one orted per other host
# through the agent ($DIR/agent, Open MPI's plm_rsh_agent), which enters that host's namespace
# and host name instead of ssh; TCP is restricted to the test subnet:
#   scripts/hosts.sh exec fsdph0 mpirun --hostfile $DIR/hostfile --mca plm_rsh_agent $DIR/agent \
#     --mca btl self,vader,tcp --mca btl_tcp_if_include 198.18.0.0/15 \
#     --mca oob_tcp_if_include 198.18.0.0/15 -npernode 2 build/bin/fsdp-train ...
# ($DIR/mpirun_args holds exactly these options.)
set -euo pipefail

PREFIX=${FSDP_HOSTS_PREFIX:-fsdph}
DIR=${FSDP_HOSTS_DIR:-/tmp/$PREFIX}
SWITCH="${PREFIX}-sw"
SUBNET=198.18.0.0/15

die() { echo "hosts.sh: $*" >&2; exit 1; }

host_addr() { echo "198.18.0.$(( $1 + 1 ))"; }

check() {
  if [ "$(id -u)" != 0 ]; then echo "needs root to create network namespaces"; return 77; fi
  for t in ip unshare tc; do
    command -v "$t" >/dev/null || { echo "needs $t"; return 77; }
  done
  local probe="${PREFIX}-probe$$"
  if ! ip netns add "$probe" 2>/dev/null; then echo "ip netns add is not permitted here"; return 77; fi
  local ok=0
  ip netns exec "$probe" unshare --uts true 2>/dev/null || ok=1
  ip netns exec "$probe" ip link add "${PREFIX}pa" type veth peer name "${PREFIX}pb" 2>/dev/null || ok=2
  ip netns del "$probe"
  case $ok in
    1) echo "unshare --uts is not permitted here"; return 77 ;;
    2) echo "veth links are not permitted here"; return 77 ;;
  esac
  return 0
}

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    case "$ns" in
      "$SWITCH"|"$PREFIX"[0-9]*) ip netns del "$ns" 2>/dev/null || true ;;
    esac
  done
  rm -rf "$DIR"
}

up() {
  local k=$1 rate=${2:-}
  [[ "$k" =~ ^[1-9][0-9]?$ ]] && [ "$k" -le 32 ] || die "up K: K must be 1..32, got '$k'"
  down
  # A failed `up` leaves nothing behind.
  trap 'down; exit 1' ERR
  ip netns add "$SWITCH"
  ip -n "$SWITCH" link add br0 type bridge
  ip -n "$SWITCH" link set br0 up
  ip -n "$SWITCH" link set lo up
  mkdir -p "$DIR"
  : > "$DIR/hostfile"
  local i ns
  for (( i = 0; i < k; i++ )); do
    ns="$PREFIX$i"
    ip netns add "$ns"
    # Both ends are created inside the namespaces, so no link ever appears in the caller's one.
    ip -n "$ns" link add eth0 type veth peer name "p$i" netns "$SWITCH"
    ip -n "$SWITCH" link set "p$i" master br0 up
    ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    if [ -n "$rate" ]; then
      # tbf: RATE sustained, a 1 ms burst at that rate (at least 64 KiB), 50 ms queue.
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
      ip netns exec "$SWITCH" tc qdisc add dev "p$i" root tbf rate "$rate" burst 256kb latency 50ms
    fi
    echo "$ns slots=64" >> "$DIR/hostfile"
  done
  # Open MPI's rsh launcher calls: agent [options] HOST COMMAND...; the agent runs COMMAND inside
  # HOST's namespace under HOST's own host name (a UTS namespace), as ssh would on a real host.
  cat > "$DIR/agent" <<EOF
#!/usr/bin/env bash
set -euo pipefail
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case "\$host" in
  $PREFIX[0-9]*) ;;
  *) echo "agent: \$host is not a test host ($PREFIX<i>)" >&2; exit 1 ;;
esac
exec ip netns exec "\$host" unshare --uts sh -c 'hostname "\$0"; exec sh -c "\$1"' "\$host" "\$*"
EOF
  chmod +x "$DIR/agent"
  cat > "$DIR/mpirun_args" <<EOF
--hostfile $DIR/hostfile --mca plm_rsh_agent $DIR/agent --mca btl self,vader,tcp --mca btl_tcp_if_include $SUBNET --mca oob_tcp_if_include $SUBNET
EOF
  trap - ERR
  echo "hosts.sh: $k hosts up: $(for (( i = 0; i < k; i++ )); do printf '%s=%s ' "$PREFIX$i" "$(host_addr "$i")"; done)"
  echo "hosts.sh: hostfile $DIR/hostfile, mpirun options in $DIR/mpirun_args"
}

host_exec() {
  local host=$1; shift
  case "$host" in "$PREFIX"[0-9]*) ;; *) die "exec: '$host' is not a test host" ;; esac
  ip netns list | awk '{print $1}' | grep -qx "$host" || die "exec: host $host is not up"
  exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0"; shift; exec "$@"' "$host" _ "$@"
}

counters() {
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$PREFIX[0-9]+$" | sort -V); do
    echo "$ns $(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/rx_bytes) $(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes)"
  done
}

case "${1:-}" in
  up) [ $# -ge 2 ] || die "usage: hosts.sh up K [RATE]"; up "$2" "${3:-}" ;;
  down) down ;;
  exec) [ $# -ge 3 ] || die "usage: hosts.sh exec HOST CMD..."; shift; host_exec "$@" ;;
  counters) counters ;;
  check) check ;;
  *) echo "usage: hosts.sh up K [RATE] | down | exec HOST CMD... | counters | check" >&2; exit 2 ;;
esac
