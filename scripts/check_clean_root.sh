#!/usr/bin/env bash
# The README's commands on a clean Debian 12 root, as a new user would run them: debootstrap makes
# a minimal bookworm root (Debian's own python3, no pip, nothing of ours), the working tree is
# copied in, and inside `unshare` + `chroot` only the README's steps run.
#
#   scripts/check_clean_root.sh install   install_deps.sh (apt + the project's venv) and the
#                                         configure step, then checks: the system Python got
#                                         nothing, the venv has torch and every test reference,
#                                         every optional test is on; a tool removed is reported
#                                         as a skipped test with its reason at the next
#                                         configure, and back on once installed again (CI)
#   scripts/check_clean_root.sh full      bash scripts/test.sh, then bash scripts/demo.sh
#
# What comes from this machine: the Debian mirror, its local certificate authorities, and its pip
# configuration (PIP_* variables, pip.conf, a mirror / find-links folder bound read-only), so pip
# resolves torch==2.13.0 as it does here. Nothing else of its environment goes in (env -i).
# Downloads are cached under VIDIT_CLEAN_ROOT_CACHE (~/.cache/vidit/clean-root: the debootstrap
# tarball and apt's .deb files); what gets installed is installed afresh every run.
# Needs root (debootstrap, mount, chroot). Prints each phase's seconds; exit 0 when all held.
set -euo pipefail
MODE=${1:-install}
[[ "$MODE" == install || "$MODE" == full ]] || { echo "usage: $0 install|full"; exit 2; }
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ $(id -u) -eq 0 ]] || { echo "check_clean_root: needs root (debootstrap, mount, chroot)"; exit 2; }
CACHE=${VIDIT_CLEAN_ROOT_CACHE:-$HOME/.cache/vidit/clean-root}
NEW=${VIDIT_CLEAN_ROOT:-$(mktemp -d /tmp/vidit-clean-root.XXXXXX)}
chmod 755 "$NEW"  # a root directory others can enter (mktemp makes it 0700; munge's postinst runs as munge)
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$CACHE/apt"
command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
cleanup() {
  # The full run's logs outlive the root: <cache>/last-full/.
  if [[ -f "$NEW/root/test.log" ]]; then
    rm -rf "$CACHE/last-full" && mkdir -p "$CACHE/last-full"
    cp "$NEW"/root/*.log "$CACHE/last-full/" 2>/dev/null || true
    cp "$NEW"/root/vidit/build/Testing/Temporary/LastTest.log* "$CACHE/last-full/" 2>/dev/null || true
    echo "[clean_root] logs in $CACHE/last-full/"
  fi
  [[ "${VIDIT_KEEP_ROOT:-0}" == 1 ]] && echo "[clean_root] kept $NEW" || rm -rf --one-file-system "$NEW"
}
trap cleanup EXIT
t0=$(date +%s)
phase() { echo "[clean_root] $(( $(date +%s) - t0 )) s: $*"; }

# 1. A minimal Debian 12 (the tarball of its packages is cached; unpacking installs them afresh).
TARBALL="$CACHE/bookworm-minbase.tgz"
if [[ ! -f "$TARBALL" ]]; then
  debootstrap --variant=minbase --make-tarball="$TARBALL.tmp" bookworm "$NEW/.make" "$MIRROR" >/dev/null
  mv "$TARBALL.tmp" "$TARBALL"; rm -rf "$NEW/.make"
fi
debootstrap --variant=minbase --unpack-tarball="$TARBALL" bookworm "$NEW" "$MIRROR" >/dev/null
phase "debian 12 root made ($NEW)"

# 2. The user's checkout: the working tree as git sees it (tracked and untracked, not ignored).
mkdir -p "$NEW/root/vidit"
(cd "$SRC" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$NEW/root/vidit"
cp /etc/resolv.conf "$NEW/etc/resolv.conf"
# What Debian's installer writes and debootstrap leaves out: without /etc/hosts, "localhost" does
# not resolve (torchrun's rendezvous store listens there).
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n' "$(hostname)" > "$NEW/etc/hosts"
hostname > "$NEW/etc/hostname"
# This machine's network setup: the local certificate authorities (a TLS-inspecting proxy's, if
# any), which Debian's ca-certificates adds to the bundle when the install step installs it.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$NEW/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$NEW/usr/local/share/ca-certificates/"
fi
# This machine's pip configuration and the local folders it names.
PIP_BINDS=()
for f in /etc/pip.conf /etc/xdg/pip /root/.config/pip; do
  [[ -e "$f" ]] && mkdir -p "$NEW$(dirname "$f")" && cp -r "$f" "$NEW$f"
done
for d in $(cat /etc/pip.conf /etc/xdg/pip/*.conf /root/.config/pip/*.conf 2>/dev/null | grep -oE '(file://)?/opt/[^ ]+' | sed 's|file://||' | sort -u); do
  d=${d%/simple}; [[ -d "$d" ]] && PIP_BINDS+=("$d")
done

# 3. Inside: the README's steps only. A private mount namespace, so nothing stays mounted.
{ while IFS='=' read -r k v; do printf 'export %s=%q\n' "$k" "$v"; done \
    < <(env | grep -E '^(PIP_[A-Z_]+|https?_proxy|HTTPS?_PROXY|no_proxy|NO_PROXY)='); } > "$NEW/root/machine_env.sh"
cat > "$NEW/root/steps.sh" <<EOF
source /root/machine_env.sh
set -euo pipefail
export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
cd /root/vidit
t0=\$(date +%s)
phase() { echo "[clean_root] inside, \$(( \$(date +%s) - t0 )) s: \$*"; }
if [[ "$MODE" == install ]]; then
  bash scripts/install_deps.sh
  phase "scripts/install_deps.sh done"
  VIDIT_CONFIGURE_ONLY=1 bash scripts/build.sh 2>&1 | tee /root/configure.log | grep -E '^-- vidit|^  '
  phase "configured"
  grep -q 'every optional test is on' /root/configure.log || { echo "FAIL: an optional test is off"; exit 1; }
  if /usr/bin/python3 -c 'import torch' 2>/dev/null; then echo "FAIL: torch went into the system Python"; exit 1; fi
  .venv/bin/python -c 'import torch, transformers, sentencepiece, diffusers, safetensors, tensorboard; print("venv: torch", torch.__version__, "transformers", transformers.__version__, "diffusers", diffusers.__version__)'
  # A tool that goes away is a skipped test with its reason at the next configure ...
  DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq slurm-client >/dev/null
  cmake -S . -B build > /root/configure2.log 2>&1
  grep -q 'Slurm.PreemptedJobRequeuesAndResumes (no sbatch' /root/configure2.log || { echo "FAIL: no skip reason for the Slurm tests"; cat /root/configure2.log; exit 1; }
  (cd build && ctest -R Slurm.Preempted --output-on-failure) | grep -E 'Skipped|skipped:'
  # ... and on again once the README's install step has put it back.
  VIDIT_CONFIGURE_ONLY=1 bash scripts/build.sh > /root/configure3.log 2>&1
  grep -q 'every optional test is on' /root/configure3.log || { echo "FAIL: the Slurm tests did not come back"; exit 1; }
  phase "a removed tool was reported as a skip, and found again after install_deps"
else
  status=0
  bash scripts/test.sh > /root/test.log 2>&1 || status=\$?
  grep -E 'tests passed|\(Failed\)|\(Timeout\)' /root/test.log || tail -n 20 /root/test.log
  phase "bash scripts/test.sh done (status \$status)"
  bash scripts/demo.sh > /root/demo.log 2>&1 || status=\$?
  tail -n 8 /root/demo.log
  phase "bash scripts/demo.sh done"
  [[ \$status == 0 ]] || { echo "[clean_root] FAIL: see the logs"; exit 1; }
fi
echo "[clean_root] PASS ($MODE)"
EOF
CHROOT=$(command -v chroot)
BINDS=""
for d in "${PIP_BINDS[@]}"; do BINDS+="mkdir -p '$NEW$d' && mount --bind -o ro '$d' '$NEW$d'; "; done
# The root is made a mount point first, as an installed system's / is: \`ip netns exec\` (the
# tests' hosts made of network namespaces) remounts / as a slave, which fails on a plain directory.
unshare --mount --propagation private bash -euc "
  mount --bind '$NEW' '$NEW'
  mount -t proc proc '$NEW/proc'
  mount --rbind /sys '$NEW/sys'
  mount --rbind /dev '$NEW/dev'
  mkdir -p '$NEW/var/cache/apt/archives' && mount --bind '$CACHE/apt' '$NEW/var/cache/apt/archives'
  $BINDS
  env -i HOME=/root TERM=dumb '$CHROOT' '$NEW' /bin/bash /root/steps.sh
"
phase "PASS: the README's $MODE steps on a clean Debian 12 root"
