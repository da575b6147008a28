#!/usr/bin/env bash
# A whole Airlock cluster on one machine, to try and test the many-machine setup: PostgreSQL,
# an S3 server, N nodes and M gateways. Each node runs as if on a host of its own: in a network
# namespace of its own (alc-node-I, address 10.78.0.(10+I) on the host's bridge alc-br0, which is
# 10.78.0.1), with its own data dir and `--instance node-I` (so that no node sees, or sweeps,
# another's sandboxes). Gateways run on the host, at 127.0.0.1:(3100+J). PostgreSQL and S3
# listen on 10.78.0.1 too, for the nodes. Webhooks may be at private addresses
# (--webhooks-allow-private): nodes then accept a test's receiver on the host's loopback, which
# only gateways (on the host) reach, for the events they send.
#
#   scripts/cluster.sh up [--nodes N] [--gateways M] [--dir DIR]     (default: 2 nodes, 1 gateway)
#       prints only `export ...` lines, to eval: E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (a
#       tenant's key) of the first gateway (of the first node with --gateways 0),
#       AIRLOCK_GATEWAYS and AIRLOCK_NODES (URLs, space-separated), AIRLOCK_OPERATOR_KEY and
#       AIRLOCK_CLUSTER_DIR, and AIRLOCK_CLUSTER_DATABASE_URL and AIRLOCK_CLUSTER_DATABASE_CA (for
#       `airlock key --database ... --database-ca ...`: PostgreSQL takes TLS connections only).
#       Everything else goes to stderr; logs are in DIR/logs/NAME.log.
#   scripts/cluster.sh stop-node NAME [--dir DIR]
#       kills node NAME (e.g. node-1) and all of its sandboxes at once, as a power loss would
#   scripts/cluster.sh start-node NAME [--dir DIR]
#       starts node NAME again (after stop-node), on its data dir, and waits until it answers
#   scripts/cluster.sh stop-gateway NAME [--dir DIR] / start-gateway NAME [--dir DIR]
#       kills gateway NAME (e.g. gateway-1) / starts it again
#   scripts/cluster.sh down [--dir DIR]
#       stops everything and removes all that `up` made; safe to repeat
#
# DIR: `up` makes a private one under /var/tmp; the others take $AIRLOCK_CLUSTER_DIR. Needs root
# and the release build (scripts/prepare.sh). One cluster per host: the names are fixed. A plain
# `airlock serve` may run on the host meanwhile (its names are not the nodes'), but if it was
# started on a host that did not forward, its firewall forwards only its own sandboxes, and the
# nodes' sandboxes reach no internet until it stops.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/templates-dir.sh
. scripts/templates-dir.sh

AIRLOCK=$PWD/target/release/airlock
BRIDGE=alc-br0
HOST_ADDR=10.78.0.1
NETWORK=10.78.0.0/24
TABLE="inet airlock_cluster"
HEALTH_WAIT_SECS=300

log() { echo "cluster.sh: $*" >&2; }
die() { log "$@"; exit 1; }
usage() {
  echo "usage: $0 up [--nodes N] [--gateways M] [--dir DIR] | stop-node NAME [--dir DIR]" \
    "| start-node NAME [--dir DIR] | stop-gateway NAME [--dir DIR]" \
    "| start-gateway NAME [--dir DIR] | down [--dir DIR]" >&2
  exit 2
}

node_addr() { echo "10.78.0.$((10 + ${1#node-}))"; }
node_names() { if [ -f "$dir/nodes" ]; then cat "$dir/nodes"; fi; }

# --- the network: a bridge on the host, one netns per node -----------------------------------

network_up() {
  ip link add "$BRIDGE" type bridge
  ip addr add "$HOST_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Nodes reach the internet (their sandboxes, their DNS) through the host, as a LAN would.
  cat /proc/sys/net/ipv4/ip_forward >"$dir/ip_forward.before"
  echo 1 >/proc/sys/net/ipv4/ip_forward
  # If the host did not forward before, it forwards only for nodes (and for a plain `airlock
  # serve`'s sandbox links, alv*: accepting them here opens nothing, its own table decides).
  local others=accept
  [ "$(cat "$dir/ip_forward.before")" = 1 ] || others=drop
  nft -f - <<EOF
table $TABLE {
	chain forward {
		type filter hook forward priority filter; policy accept;
		ct state established,related accept
		iifname "$BRIDGE" accept
		iifname "alv*" accept
		oifname "$BRIDGE" drop
		$others
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr $NETWORK oifname != "$BRIDGE" masquerade
	}
}
EOF
}

node_netns_up() {
  local name=$1 ns=alc-$1
  ip netns add "$ns"
  ip link add "$ns" type veth peer name eth0 netns "$ns"
  ip link set "$ns" master "$BRIDGE" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$(node_addr "$name")/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route add default via "$HOST_ADDR"
}

# --- processes ---------------------------------------------------------------------------------

# `airlock` on the cluster's PostgreSQL, as the operator would run it (key create, ...).
admin() {
  "$AIRLOCK" --data-dir "$dir/admin" --database "$PGURL" --database-ca "$PGCA" "$@" \
    2>>"$dir/logs/admin.log" ||
    { tail -n 5 "$dir/logs/admin.log" >&2; return 1; }
}

wait_healthy() {
  local name=$1 url=$2 pid
  pid=$(cat "$dir/pids/$name")
  for _ in $(seq $((HEALTH_WAIT_SECS * 5))); do
    if curl -fsS --max-time 2 "$url/health" >/dev/null 2>&1; then return; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  tail -n 40 "$dir/logs/$name.log" >&2
  die "$name did not answer $url/health (its log: $dir/logs/$name.log)"
}

# A node: root, in its netns. nsenter, not `ip netns exec`, which remounts /sys (hiding the
# cgroup v1 hierarchies runsc needs): the node keeps the host's mounts and /run/netns, and
# the driver looks its links up in its own netns itself.
#
# Templates: node-1 keeps them in the host's templates dir (the cache the test suites share).
# Every other node has a dir of its own, seen at the same path in a mount namespace of its own
# (template records name absolute paths; on Kubernetes every node's host path is the same), so
# it starts with no template and fetches them from object storage, as a new machine would.
start_node() {
  local name=$1 own
  local node=(nsenter --net="/run/netns/alc-$name" -- "$AIRLOCK"
    --data-dir "$dir/$name" --database "$PGURL" --database-ca "$PGCA"
    serve --role node --cluster-secret-file "$dir/cluster-secret"
    --node-name "$name" --instance "$name"
    --listen 0.0.0.0:3000 --object-store "$S3URL" --webhooks-allow-private)
  if [ "$name" != node-1 ]; then
    own=$dir/$name-templates
    mkdir -p "$own"
    # shellcheck disable=SC2016  # expanded by that shell
    node=(unshare --mount --propagation slave -- sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
      sh "$own" "$AIRLOCK_TEMPLATES_DIR" "${node[@]}")
  fi
  setsid "${node[@]}" >>"$dir/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/pids/$name"
}

# Gateway J: on the host, at 127.0.0.1:(3100+J), in front of every node.
gateway_port() { echo $((3100 + ${1#gateway-})); }
start_gateway() {
  local name=$1 port nodes
  port=$(gateway_port "$name")
  nodes=$(cat "$dir/node-endpoints")
  setsid "$AIRLOCK" --data-dir "$dir/$name" --database "$PGURL" --database-ca "$PGCA" \
    serve --role gateway --listen "127.0.0.1:$port" --nodes "$nodes" \
    --cluster-secret-file "$dir/cluster-secret" --webhooks-allow-private \
    >"$dir/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/pids/$name"
}

# Every process that is the node: the daemon and netd (in its netns), its sandboxes (in their
# cgroups and netns), and whatever either was starting. SIGKILL, repeated until none is left,
# so nothing gets to clean up after itself.
kill_node() {
  local name=$1 pids pass pid
  if [ -f "$dir/pids/$name" ]; then
    pid=$(cat "$dir/pids/$name")
    # Its mount namespace (node-2 on): what runs in it is the node's too.
    if [ "$(readlink "/proc/$pid/ns/mnt" 2>/dev/null)" != "$(readlink /proc/self/ns/mnt)" ]; then
      readlink "/proc/$pid/ns/mnt" >"$dir/mntns-$name" 2>/dev/null || true
    fi
    kill -9 "$pid" 2>/dev/null || true
  fi
  for pass in $(seq 20); do
    pids=$(node_pids "$name")
    [ -n "$pids" ] || { rm -f "$dir/pids/$name" "$dir/mntns-$name"; return; }
    # A frozen (cgroup v1 freezer) process dies only once thawed.
    for state in /sys/fs/cgroup/freezer/airlock-"$name"/*/freezer.state; do
      if [ -f "$state" ]; then echo THAWED >"$state" 2>/dev/null || true; fi
    done
    # shellcheck disable=SC2086  # a list of pids
    kill -9 $pids 2>/dev/null || true
    [ "$pass" = 1 ] || sleep 0.2
  done
  die "some processes of $name would not die: $(node_pids "$name")"
}

node_pids() {
  local name=$1 ns
  {
    cat /sys/fs/cgroup/*/airlock-"$name"/*/cgroup.procs /sys/fs/cgroup/airlock-"$name"/*/cgroup.procs 2>/dev/null || true
    for ns in "/run/netns/alc-$name" /run/netns/al."$name".*; do
      if [ -e "$ns" ]; then ip netns pids "$(basename "$ns")" 2>/dev/null || true; fi
    done
    if [ -f "$dir/mntns-$name" ]; then
      local mntns proc
      mntns=$(cat "$dir/mntns-$name")
      for proc in /proc/[0-9]*; do
        [ "$(readlink "$proc/ns/mnt" 2>/dev/null)" != "$mntns" ] || echo "${proc#/proc/}"
      done
    fi
  } | sort -un | tr '\n' ' ' | sed 's/ *$//'
}

# What a node leaves on the host once its processes are gone: its sandboxes' netns, cgroups and
# run files, then its own netns (its veth goes with it).
clean_node() {
  local name=$1 ns ino cg
  for ns in /run/netns/al."$name".*; do
    [ -e "$ns" ] && ip netns del "$(basename "$ns")"
  done
  for cg in /sys/fs/cgroup/*/airlock-"$name" /sys/fs/cgroup/airlock-"$name"; do
    [ -d "$cg" ] || continue
    find "$cg" -mindepth 1 -depth -type d -exec rmdir {} + 2>/dev/null || true
    rmdir "$cg"
  done
  rm -rf "/run/airlock/$name"
  if [ -e "/run/netns/alc-$name" ]; then
    ino=$(stat -L -c %i "/run/netns/alc-$name")
    rm -f "/run/airlock/netns-$ino.lock"
    ip netns del "alc-$name"
  fi
  # The kernel may keep a deleted netns a while (its sockets' last packets): its veth goes now,
  # unless the kernel took it meanwhile.
  ip link del "alc-$name" 2>/dev/null || ! ip link show "alc-$name" >/dev/null 2>&1
}

# --- commands -----------------------------------------------------------------------------------

up() {
  local nodes=2 gateways=1
  while [ $# -gt 0 ]; do
    case "$1" in
    --nodes) nodes=${2:?}; shift 2 ;;
    --gateways) gateways=${2:?}; shift 2 ;;
    --dir) dir=${2:?}; shift 2 ;;
    *) usage ;;
    esac
  done
  if ! [[ $nodes =~ ^[0-9]+$ ]] || [ "$nodes" -lt 1 ] || [ "$nodes" -gt 200 ]; then
    die "--nodes: 1 to 200"
  fi
  if ! [[ $gateways =~ ^[0-9]+$ ]] || [ "$gateways" -gt 100 ]; then die "--gateways: 0 to 100"; fi
  [ -x "$AIRLOCK" ] || die "no $AIRLOCK: build it first (scripts/prepare.sh)"
  ip link show "$BRIDGE" >/dev/null 2>&1 &&
    die "a cluster is up already (bridge $BRIDGE exists): scripts/cluster.sh down --dir ITS_DIR first"
  if [ -z "${dir:-}" ]; then
    dir=$(mktemp -d /var/tmp/airlock-cluster.XXXXXX)
  else
    mkdir -p "$dir"
  fi
  dir=$(realpath "$dir")
  # Traversable, for PostgreSQL (which runs as its own user).
  chmod 711 "$dir"
  touch "$dir/cluster"
  [ -d /run/airlock ] || touch "$dir/made-run-airlock"
  mkdir -p "$dir/logs" "$dir/pids"
  trap 'log "up failed; tearing down"; { down_all && rm -rf "$dir"; } >&2 || true' EXIT
  log "cluster dir $dir"

  network_up
  local i name node_urls=() gateway_urls=()
  for i in $(seq "$nodes"); do
    echo "node-$i" >>"$dir/nodes"
    node_netns_up "node-$i"
  done
  local exports key operator
  # TLS only, as a managed PostgreSQL would be: every gateway and node verifies it.
  exports=$(POSTGRES_TLS=1 scripts/postgres.sh start "$dir/postgres" "" "$HOST_ADDR/24")
  eval "$exports"
  PGURL=$AIRLOCK_TEST_POSTGRES_URL PGCA=$AIRLOCK_TEST_POSTGRES_CA
  exports=$(scripts/s3.sh start "$dir/s3" "" "$HOST_ADDR")
  eval "$exports"
  S3URL=$AIRLOCK_TEST_S3_URL
  (umask 077 && printf 'PGURL=%q\nPGCA=%q\nS3URL=%q\n' "$PGURL" "$PGCA" "$S3URL" >"$dir/env")
  (umask 077 && head -c 32 /dev/urandom | base64 >"$dir/cluster-secret")
  key=$(admin key create --name cluster-tenant)
  operator=$(admin key create --operator --name cluster-operator)

  # The first node alone first: it puts the built-in templates in object storage, where the
  # others then find them.
  for i in $(seq "$nodes"); do
    name=node-$i
    node_urls+=("http://$(node_addr "$name"):3000")
    start_node "$name"
    [ "$i" -gt 1 ] || wait_healthy "$name" "${node_urls[0]}"
  done
  for i in $(seq "$nodes"); do
    wait_healthy "node-$i" "${node_urls[$((i - 1))]}"
    log "node-$i is up at ${node_urls[$((i - 1))]}"
  done
  (IFS=,; echo "${node_urls[*]}") >"$dir/node-endpoints"
  for i in $(seq "$gateways"); do
    echo "gateway-$i" >>"$dir/gateways"
    start_gateway "gateway-$i"
    gateway_urls+=("http://127.0.0.1:$(gateway_port "gateway-$i")")
  done
  for i in $(seq "$gateways"); do
    wait_healthy "gateway-$i" "${gateway_urls[$((i - 1))]}"
    log "gateway-$i is up at ${gateway_urls[$((i - 1))]}"
  done
  trap - EXIT

  local entry=${gateway_urls[0]:-${node_urls[0]}}
  echo "export E2B_API_URL=$entry E2B_SANDBOX_URL=$entry E2B_API_KEY=$key"
  echo "export AIRLOCK_GATEWAYS=\"${gateway_urls[*]}\""
  echo "export AIRLOCK_NODES=\"${node_urls[*]}\""
  echo "export AIRLOCK_OPERATOR_KEY=$operator"
  echo "export AIRLOCK_CLUSTER_DIR=$dir"
  # Not AIRLOCK_DATABASE_URL, which an `airlock serve` started in the same shell would take.
  printf 'export AIRLOCK_CLUSTER_DATABASE_URL=%q\n' "$PGURL"
  printf 'export AIRLOCK_CLUSTER_DATABASE_CA=%q\n' "$PGCA"
}

# Everything `up` made, whatever state it is in; each step is a no-op once done.
down_all() {
  local name pidfile
  for pidfile in "$dir"/pids/gateway-*; do
    if [ -f "$pidfile" ]; then kill -9 "$(cat "$pidfile")" 2>/dev/null || true; fi
    rm -f "$pidfile"
  done
  for name in $(node_names); do
    kill_node "$name"
    clean_node "$name"
  done
  scripts/postgres.sh stop "$dir/postgres" 2>/dev/null || true
  scripts/s3.sh stop "$dir/s3" || true
  # Sandbox disks and volumes are loop mounts in the nodes' data dirs.
  { findmnt -rn -o TARGET | grep -F "$dir/" || true; } | sort -r | while read -r target; do
    umount -l "$target" || true
  done
  nft delete table "$TABLE" 2>/dev/null || true
  ! ip link show "$BRIDGE" >/dev/null 2>&1 || ip link del "$BRIDGE"
  if [ -f "$dir/ip_forward.before" ]; then
    restore_forwarding "$(cat "$dir/ip_forward.before")"
    rm -f "$dir/ip_forward.before"
  fi
  if [ -f "$dir/made-run-airlock" ]; then rmdir /run/airlock 2>/dev/null || true; fi
}

# Puts back the host's forwarding switch. A plain `airlock serve` that started meanwhile found
# it on and would lose its sandboxes' internet: it is handed the record instead, and turns
# forwarding off at its own clean shutdown.
restore_forwarding() {
  local before=$1
  [ "$before" = 0 ] || return 0
  if ! flock -n /run/airlock-gvisor.lock true 2>/dev/null; then
    [ -f /run/airlock/ip_forward.before ] || echo 0 >/run/airlock/ip_forward.before
    log "left IPv4 forwarding on for the airlock serve that runs on this host"
    return
  fi
  echo 0 >/proc/sys/net/ipv4/ip_forward
}

# [--dir DIR]: sets `dir`, from AIRLOCK_CLUSTER_DIR without the flag.
dir_arg() {
  while [ $# -gt 0 ]; do
    case "$1" in
    --dir) dir=${2:?}; shift 2 ;;
    *) usage ;;
    esac
  done
  dir=${dir:-${AIRLOCK_CLUSTER_DIR:-}}
  [ -n "$dir" ] || die "which cluster? --dir DIR or AIRLOCK_CLUSTER_DIR"
}

down() {
  dir_arg "$@"
  [ -d "$dir" ] || { log "$dir is gone already"; return; }
  [ -f "$dir/cluster" ] || die "$dir is not a cluster's dir (no $dir/cluster)"
  dir=$(realpath "$dir")
  down_all
  rm -rf "$dir"
  log "cluster $dir is down"
}

# KIND NAME [--dir DIR]: sets `name` and `dir`, checks that NAME is one of the KINDs (nodes or
# gateways) of DIR's cluster.
member_args() {
  local kind=$1
  name=${2:-}
  [ -n "$name" ] || usage
  shift 2
  dir_arg "$@"
  [ -f "$dir/cluster" ] || die "$dir is not a cluster's dir (no $dir/cluster)"
  grep -qx -- "$name" "$dir/$kind" 2>/dev/null || die "$name is not one of the $kind of $dir"
}

stop_gateway() {
  local name
  member_args gateways "$@"
  if [ -f "$dir/pids/$name" ]; then kill -9 "$(cat "$dir/pids/$name")" 2>/dev/null || true; fi
  rm -f "$dir/pids/$name"
  log "$name is killed"
}

start_gateway_again() {
  local name
  member_args gateways "$@"
  [ ! -f "$dir/pids/$name" ] || ! kill -0 "$(cat "$dir/pids/$name")" 2>/dev/null ||
    die "$name runs already"
  # shellcheck source=/dev/null  # written by `up`
  . "$dir/env"
  start_gateway "$name"
  wait_healthy "$name" "http://127.0.0.1:$(gateway_port "$name")"
  log "$name is up again"
}

stop_node() {
  local name
  member_args nodes "$@"
  kill_node "$name"
  log "$name and its sandboxes are killed"
}

start_node_again() {
  local name
  member_args nodes "$@"
  [ ! -f "$dir/pids/$name" ] || ! kill -0 "$(cat "$dir/pids/$name")" 2>/dev/null ||
    die "$name runs already"
  # shellcheck source=/dev/null  # written by `up`
  . "$dir/env"
  start_node "$name"
  wait_healthy "$name" "http://$(node_addr "$name"):3000"
  log "$name is up again"
}

[ "$(id -u)" = 0 ] || die "run it as root: nodes need network namespaces, mounts and runsc"
dir=
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
up) up "$@" ;;
stop-node) stop_node "$@" ;;
start-node) start_node_again "$@" ;;
stop-gateway) stop_gateway "$@" ;;
start-gateway) start_gateway_again "$@" ;;
down) down "$@" ;;
*) usage ;;
esac
