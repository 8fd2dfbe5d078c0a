# Sourced by the tests that need several "hosts" on one machine (slow_link.sh, node_loss.sh):
# HOSTS network namespaces, each with its own hostname (a UTS namespace, given by on_host) that
# resolves to its own address (/etc/netns/<ns>/hosts, which `ip netns exec` mounts over
# /etc/hosts, names every host), and a veth pair to every other one, so each pair of hosts talks over its own link.
# Needs root, ip and unshare; a caller exits 77 (skipped) when make_hosts fails.
#   HOSTS=4 TAG=xy$$; source netns_hosts.sh; make_hosts || exit 77
#   on_host I CMD...   runs CMD in host I's namespace as "nodeI"
ns() { echo "${TAG}h$1"; }
addr() { echo "10.201.0.$(($1 + 1))"; }
# Ends what still runs in the namespaces (daemons, a test's stragglers), then removes them.
cleanup_hosts() {
  for i in $(seq 0 $((HOSTS - 1))); do
    ip netns pids "$(ns "$i")" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$(ns "$i")" 2>/dev/null; rm -rf "/etc/netns/$(ns "$i")"
  done
}
make_hosts() {
  if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
    echo "skipped: needs root, ip and unshare"; return 1
  fi
  trap cleanup_hosts EXIT
  for i in $(seq 0 $((HOSTS - 1))); do
    ip netns add "$(ns "$i")" || { echo "skipped: cannot make network namespaces"; return 1; }
    ip -n "$(ns "$i")" link set lo up
    ip -n "$(ns "$i")" addr add "$(addr "$i")/32" dev lo
    mkdir -p "/etc/netns/$(ns "$i")"
    ip netns exec "$(ns "$i")" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
  done
  # Every host knows every other by name, as a cluster's /etc/hosts does.
  for i in $(seq 0 $((HOSTS - 1))); do
    { echo "127.0.0.1 localhost"; for j in $(seq 0 $((HOSTS - 1))); do echo "$(addr "$j") node$j"; done; } \
      >"/etc/netns/$(ns "$i")/hosts"
  done
  # One veth pair per pair of hosts (v<i><j> in host i), and a route to the other's address over it.
  for i in $(seq 0 $((HOSTS - 1))); do
    for j in $(seq $((i + 1)) $((HOSTS - 1))); do
      ip link add "v$i$j" netns "$(ns "$i")" type veth peer name "v$j$i" netns "$(ns "$j")"
      ip -n "$(ns "$i")" link set "v$i$j" up
      ip -n "$(ns "$j")" link set "v$j$i" up
      ip -n "$(ns "$i")" route add "$(addr "$j")/32" dev "v$i$j" src "$(addr "$i")"
      ip -n "$(ns "$j")" route add "$(addr "$i")/32" dev "v$j$i" src "$(addr "$j")"
    done
  done
}
on_host() { local i=$1; shift; ip netns exec "$(ns "$i")" unshare --uts sh -c "hostname node$i && exec $*"; }
