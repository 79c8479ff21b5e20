#!/usr/bin/env bash
# The vgpuvirt testbed: installs and runs the real parts the integration tests talk to.
# Debian 12 (bookworm), as root (no sudo is used). Idempotent: every step checks before it acts.
#
#   scripts/testbed.sh install        apt packages, libvirtd prerequisites, .venv with vgpuvirt[all,dev]
#   scripts/testbed.sh start          virtlogd, libvirtd, a loopback sshd on 127.0.0.1:2222, a shared mnt dir;
#                                     writes $SBX/testbed.json (what tests/conftest.py reads)
#   scripts/testbed.sh stop           stops what `start`/`hosts-up` started (by pid file, nothing else)
#   scripts/testbed.sh status         one line per part; exit 0 when sshd runs and libvirtd answers on its socket
#   scripts/testbed.sh libvirt-state  ours | foreign | silent | none (read-only; see libvirt_state)
#   scripts/testbed.sh hosts-up N     N extra test hosts: sshd on 127.0.2.1..N:2222, each with its own mnt dir
#   scripts/testbed.sh hosts-down     stops the extra hosts          (netns-up/netns-down are aliases)
#   scripts/testbed.sh host-down N    stops extra host hN only (a test's "host gone"; hosts-up brings it back)
#   scripts/testbed.sh mig-up N       N migration hosts m1..mN: each its own mount namespace with private libvirt
#                                     dirs, its own virtlogd + libvirtd (distinct host_uuid, migration_address
#                                     127.0.3.N) and sshd on 127.0.3.N:2222; writes $SBX/mig/hosts.json
#   scripts/testbed.sh mig-down       stops the migration hosts and the QEMUs they ran (by pid file)
#   scripts/testbed.sh mig-libvirtd-down N   kills migration host mN's libvirtd only (mig-up restarts it)
#
# State lives in $VGPUVIRT_SBX (default /tmp/vgpuvirt-testbed). See docs/testbed.md.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SBX=${VGPUVIRT_SBX:-/tmp/vgpuvirt-testbed}
PORT=${VGPUVIRT_SSH_PORT:-2222}
VENV=${VGPUVIRT_VENV:-$REPO/.venv}
PYTHON=${PYTHON:-python3}
RUN=$SBX/run
SSH_DIR=$SBX/ssh
MNT=$SBX/mnt
ENV_FILE=$SBX/testbed.json
EXTRA_NET=127.0.2            # extra host N listens on 127.0.2.N (all of 127/8 is local: no netns needed)
MIG=$SBX/mig                 # migration hosts: their own known_hosts, wrapper and env file, so that an
MIG_NET=127.0.3              # older testbed.sh rewriting testbed.json or known_hosts never drops them
LIBVIRT_URI=${VGPUVIRT_LIBVIRT_URI:-qemu:///system}
LIBVIRT_WAIT=${VGPUVIRT_LIBVIRT_WAIT:-30}   # seconds `start` waits for a libvirtd that runs but does not answer yet
export DEBIAN_FRONTEND=noninteractive

APT_PKGS=(
  python3 python3-venv python3-dev gcc pkg-config libvirt-dev   # the venv; libvirt-python builds from sdist
  libvirt-clients libxml2-utils                                 # virsh, virt-xml-validate (needs xmllint)
  libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 qemu-utils ovmf swtpm swtpm-tools
  openssh-server openssh-client                                 # the loopback sshd; ssh for libvirt's qemu+ssh://
  fuse3 mdevctl iproute2 util-linux                             # FUSE sysfs, real mdevctl, ss, unshare, flock
  prometheus tmux                                               # the exporter's scraper; `vgpuvirt top`'s terminal
  zsh                                                           # `vgpuvirt completion zsh` is sourced in a test
  systemd                                                       # systemd-analyze verify (the layout boot unit)
)

log() { printf '[testbed %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $1"; exit "${2:-1}"; }

# $SBX ends up in sshd_config and in argv; keep it to characters no config or shell can misread.
[[ $SBX == /* && $SBX =~ ^[A-Za-z0-9/._-]+$ ]] || die "VGPUVIRT_SBX must be an absolute path of [A-Za-z0-9/._-]: $SBX" 2
[[ $PORT =~ ^[0-9]{1,5}$ ]] || die "VGPUVIRT_SSH_PORT must be a number: $PORT" 2
[[ $LIBVIRT_WAIT =~ ^[0-9]{1,4}$ ]] || die "VGPUVIRT_LIBVIRT_WAIT must be a number of seconds: $LIBVIRT_WAIT" 2

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (it starts sshd/libvirtd and makes mounts; no sudo is used)" 3; }

need_bins() {
  local b missing=()
  for b in /usr/sbin/sshd ssh-keygen libvirtd virtlogd virsh unshare mountpoint flock ss "$PYTHON"; do
    command -v "$b" >/dev/null 2>&1 || missing+=("$b")
  done
  ((${#missing[@]} == 0)) || die "missing ${missing[*]}: run scripts/testbed.sh install first" 4
}

# One testbed command at a time (several pytest sessions may call `start` together). Every daemon
# is started with 9>&- so that it does not inherit, and hold forever, this lock.
LOCKED=
take_lock() { [ -n "$LOCKED" ] && return 0; mkdir -p "$SBX"; exec 9>"$SBX/.lock"; flock 9; LOCKED=1; }

# ---------------------------------------------------------------- install
install_apt() {
  local missing=() p
  for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "apt: installing ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    log "apt: all ${#APT_PKGS[@]} packages present"
  fi
}

prep_libvirt() {
  # libvirtd's qemu driver refuses to start unless its compiled-in user exists; libvirt-daemon-system
  # would create it but drags in systemd. /dev/kvm is root-only here, so qemu runs as root.
  getent group kvm >/dev/null || groupadd --system kvm
  getent group libvirt-qemu >/dev/null || groupadd --system libvirt-qemu
  getent passwd libvirt-qemu >/dev/null || useradd --system --no-create-home --home-dir /var/lib/libvirt \
      --shell /usr/sbin/nologin -g kvm libvirt-qemu
  mkdir -p /var/log/libvirt/qemu /var/lib/libvirt /var/cache/libvirt /etc/libvirt
  grep -qs '^user = "root"' /etc/libvirt/qemu.conf || printf 'user = "root"\ngroup = "root"\n' >> /etc/libvirt/qemu.conf
  # libvirt runs swtpm_setup as 'tss'; files a root-run swtpm_localca left in its CA dir make every
  # later TPM domain fail to start ("Need read/write rights on .../.lock.swtpm-localca for user tss").
  if [ -d /var/lib/swtpm-localca ] && getent passwd tss >/dev/null; then
    chown -R tss /var/lib/swtpm-localca
  fi
}

install_venv() {
  local stamp=$VENV/.vgpuvirt-deps want
  want=$(cd "$REPO" && cat setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1)
  [ -x "$VENV/bin/python" ] || { log "venv: creating $VENV"; "$PYTHON" -m venv "$VENV"; }
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && "$VENV/bin/python" -c 'import vgpuvirt' 2>/dev/null; then
    log "venv: vgpuvirt[all,dev] present"
  else
    log "venv: pip install -e '.[all,dev]' (libvirt-python compiles from sdist, ~15 s)"
    (cd "$REPO" && "$VENV/bin/python" -m pip install -q -e '.[all,dev]')
    echo "$want" > "$stamp"
  fi
  # Byte-compile the package, as installing a wheel does (an editable install leaves it to each process):
  # where PYTHONDONTWRITEBYTECODE is set, as in these machines' shells, every vgpuvirt process the suite or the
  # demo starts would otherwise compile the modules it imports again (~90 ms of CPU per CLI call here).
  # compileall rewrites only what changed.
  "$VENV/bin/python" -m compileall -q "$REPO/vgpuvirt" >/dev/null
}

# install_script FILE: stdin becomes the executable FILE by a rename. Rewriting it in place (`cat > FILE`) while a
# libvirt connection of another test executes it fails that exec with ETXTBSY ("Text file busy": a CI-style run
# lost a migration test to it when two tests brought the migration hosts up at once).
install_script() {
  local tmp
  tmp=$(mktemp "$1.XXXXXX")
  cat > "$tmp" && chmod 755 "$tmp" && mv -f "$tmp" "$1"
}

# ---------------------------------------------------------------- helpers for daemons
# running PID: the process exists and is not a zombie (no init here reaps a dead daemon at once, and kill -0
# still finds a zombie: a stop waited until something reaped it, up to 10 s, and status called a dead libvirtd running)
running() {
  kill -0 "$1" 2>/dev/null || return 1
  [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]
}

# alive PIDFILE [WORD]: the pid file's process runs and (WORD) its command line holds WORD, so that a recycled
# pid is never taken for ours. WORD must name that one process (its own config or pid file), not its program:
# a stale pid file of one migration host whose pid now belongs to another host's virtlogd read as "running",
# and m6..m9 never came up again.
alive() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  running "$pid" || return 1
  [ -z "${2:-}" ] || tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$2"
}

stop_pidfile() {  # stop_pidfile NAME PIDFILE WORD
  local pid i
  if alive "$2" "$3"; then
    pid=$(cat "$2")
    kill "$pid"
    for i in $(seq 1 100); do running "$pid" || break; sleep 0.1; done
    running "$pid" && kill -9 "$pid"
    log "stopped $1 (pid $pid)"
  fi
  rm -f "$2"
}

wait_port() {  # wait_port ADDR PORT: up to 5 s for a listener
  local i
  for i in $(seq 1 100); do (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0; sleep 0.05; done
  return 1
}

# ---------------------------------------------------------------- ssh material
sshd_config() {  # sshd_config DIR LISTEN_ADDR NAME
  cat > "$1/sshd_config" <<EOF
# generated by scripts/testbed.sh; key-only root login on loopback, keys under $SBX
ListenAddress $2:$PORT
HostKey $1/host_ed25519
PidFile none
AuthorizedKeysFile $SSH_DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PermitUserEnvironment no
MaxSessions 100
MaxStartups 100:30:200
Subsystem sftp /usr/lib/openssh/sftp-server
# VERBOSE logs "Starting session: command for root from ADDR port N" for every exec: the tests count
# remote execs from this log, independently of the client's own counter.
LogLevel VERBOSE
EOF
  /usr/sbin/sshd -t -f "$1/sshd_config"
}

prep_ssh() {
  mkdir -p "$SSH_DIR" "$RUN" /run/sshd
  chmod 700 "$SSH_DIR"
  [ -f "$SSH_DIR/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C vgpuvirt-testbed-host -f "$SSH_DIR/host_ed25519"
  [ -f "$SSH_DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C vgpuvirt-testbed-client -f "$SSH_DIR/id_ed25519"
  install -m 600 "$SSH_DIR/id_ed25519.pub" "$SSH_DIR/authorized_keys"
  : > "$SSH_DIR/empty_bashrc"
  sshd_config "$SSH_DIR" 127.0.0.1 main
  # libvirt's qemu+ssh:// transport runs plain ssh: this wrapper makes it check our known_hosts strictly.
  install_script "$SSH_DIR/ssh-wrapper" <<EOF
#!/bin/sh
exec /usr/bin/ssh -o UserKnownHostsFile=$SSH_DIR/known_hosts -o StrictHostKeyChecking=yes -o BatchMode=yes "\$@"
EOF
  write_known_hosts
}

write_known_hosts() {
  local d i
  {
    printf '[127.0.0.1]:%s %s\n' "$PORT" "$(cut -d' ' -f1,2 "$SSH_DIR/host_ed25519.pub")"
    for d in "$SBX"/hosts/h*; do
      [ -f "$d/host_ed25519.pub" ] || continue
      i=${d##*/h}
      printf '[%s.%s]:%s %s\n' "$EXTRA_NET" "$i" "$PORT" "$(cut -d' ' -f1,2 "$d/host_ed25519.pub")"
    done
  } > "$SSH_DIR/known_hosts.new"
  mv "$SSH_DIR/known_hosts.new" "$SSH_DIR/known_hosts"
}

# start_sshd NAME DIR ADDR: sshd in its own mount namespace (slave propagation) where root's ~/.bashrc
# is an empty file: on these machines it runs `pyenv init` (~150 ms on every exec); slave propagation
# still shows FUSE mounts made later under the shared $MNT.
start_sshd() {
  local name=$1 dir=$2 addr=$3 pidfile=$RUN/sshd-$1.pid bashrc
  if alive "$pidfile" "$dir/sshd_config"; then return 0; fi
  bashrc=$(getent passwd root | cut -d: -f6)/.bashrc
  # shellcheck disable=SC2016  # $1.. are expanded by the inner sh, from argv, never spliced
  nohup unshare -m --propagation slave sh -c \
    'if [ -e "$1" ]; then mount --bind "$2" "$1" || exit 1; fi; exec /usr/sbin/sshd -D -f "$3" -E "$4"' \
    sshd-ns "$bashrc" "$SSH_DIR/empty_bashrc" "$dir/sshd_config" "$RUN/sshd-$name.log" >>"$RUN/sshd-$name.out" 2>&1 9>&- &
  echo $! > "$pidfile"
  wait_port "$addr" "$PORT" || { tail -5 "$RUN/sshd-$name.out" "$RUN/sshd-$name.log" >&2 || true; die "sshd $name did not listen on $addr:$PORT"; }
  log "sshd $name listening on $addr:$PORT (pid $(cat "$pidfile"))"
}

# ---------------------------------------------------------------- migration hosts
# Migration host mN is one mount namespace (private propagation) holding fresh directories bind-mounted
# over libvirt's run/state/cache/log/config dirs: a libvirtd started in the root namespace would take the
# main one's sockets (TESTBED.md "More than one libvirtd"). Its sshd, virtlogd and libvirtd all run in it;
# the namespace lives as long as its sshd (the pid in sshd-mN.pid), and nsenter restarts a killed libvirtd.
mig_conf() {  # mig_conf N: the host's directories and configuration (idempotent)
  local n=$1 d=$MIG/m$1
  mkdir -p "$d"/{run,lib,cache/qemu/capabilities,log/qemu,etc/qemu}
  chmod 700 "$d"
  [ -f "$d/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C "vgpuvirt-testbed-m$n" -f "$d/host_ed25519"
  sshd_config "$d" "$MIG_NET.$n" "m$n"
  # libvirt refuses a migration between two daemons with one host UUID ("the same host")
  printf 'host_uuid = "76677075-7669-7274-6d69-%012x"\n' "$n" > "$d/etc/libvirtd.conf"
  # Each host's QEMU listens for incoming migrations on its own address and port range.
  cat > "$d/etc/qemu.conf" <<EOF
user = "root"
group = "root"
migration_address = "$MIG_NET.$n"
migration_host = "$MIG_NET.$n"
migration_port_min = $((50000 + n * 32))
migration_port_max = $((50000 + n * 32 + 31))
EOF
  : > "$d/etc/virtlogd.conf"
  # the main daemon's QEMU capability cache spares each host the ~8 s probe (libvirtd re-probes if stale)
  cp -n /var/cache/libvirt/qemu/capabilities/*.xml "$d/cache/qemu/capabilities/" 2>/dev/null || true
}

mig_known_hosts() {
  local d
  mkdir -p "$MIG"
  for d in "$MIG"/m*; do
    [ -f "$d/host_ed25519.pub" ] || continue
    printf '[%s.%s]:%s %s\n' "$MIG_NET" "${d##*/m}" "$PORT" "$(cut -d' ' -f1,2 "$d/host_ed25519.pub")"
  done > "$MIG/known_hosts.new"
  mv "$MIG/known_hosts.new" "$MIG/known_hosts"
  install_script "$MIG/ssh-wrapper" <<EOF
#!/bin/sh
exec /usr/bin/ssh -o UserKnownHostsFile=$MIG/known_hosts -o StrictHostKeyChecking=yes -o BatchMode=yes "\$@"
EOF
}

# mig_answers N: host mN's own libvirtd answers through its sshd (what the tests and migrations use)
mig_answers() {
  virsh -q -c "qemu+ssh://root@$MIG_NET.$1:$PORT/system?keyfile=$SSH_DIR/id_ed25519&command=$MIG/ssh-wrapper" \
    version >/dev/null 2>&1
}

# mig_daemons N: virtlogd and libvirtd inside host mN's namespace (entered through its sshd's pid)
mig_daemons() {
  local n=$1 d=$MIG/m$1 ns i
  ns=$(cat "$RUN/sshd-m$n.pid")
  alive "$d/virtlogd.pid" "$d/etc/virtlogd.conf" || nsenter -t "$ns" -m virtlogd -d -f "$d/etc/virtlogd.conf" -p "$d/virtlogd.pid" 9>&-
  if ! alive "$d/libvirtd.pid" "$d/etc/libvirtd.conf"; then
    LIBVIRT_LOG_OUTPUTS="3:file:$RUN/libvirtd-m$n.log" \
      nsenter -t "$ns" -m libvirtd -d -f "$d/etc/libvirtd.conf" --pid-file "$d/libvirtd.pid" 9>&-
  fi
  for i in $(seq 1 600); do mig_answers "$n" && return 0; sleep 0.1; done
  tail -20 "$RUN/libvirtd-m$n.log" >&2 || true
  die "libvirtd of migration host m$n did not answer"
}

mig_start() {  # mig_start N: the namespace with its bind mounts, and its sshd
  local n=$1 d=$MIG/m$1 pidfile=$RUN/sshd-m$1.pid bashrc
  if alive "$pidfile" "$d/sshd_config"; then return 0; fi
  bashrc=$(getent passwd root | cut -d: -f6)/.bashrc
  # shellcheck disable=SC2016  # $1.. are expanded by the inner sh, from argv, never spliced
  nohup unshare -m --propagation private sh -c '
    set -e
    d=$1
    mount --bind "$d/run" /run/libvirt
    mount --bind "$d/lib" /var/lib/libvirt
    mount --bind "$d/cache" /var/cache/libvirt
    mount --bind "$d/log" /var/log/libvirt
    mount --bind "$d/etc" /etc/libvirt
    if [ -e "$2" ]; then mount --bind "$3" "$2"; fi
    exec /usr/sbin/sshd -D -f "$d/sshd_config" -E "$4"' \
    mig-ns "$d" "$bashrc" "$SSH_DIR/empty_bashrc" "$RUN/sshd-m$n.log" >>"$RUN/sshd-m$n.out" 2>&1 9>&- &
  echo $! > "$pidfile"
  wait_port "$MIG_NET.$n" "$PORT" || { tail -5 "$RUN/sshd-m$n.out" >&2 || true; die "sshd m$n did not listen on $MIG_NET.$n:$PORT"; }
  log "migration host m$n: namespace and sshd on $MIG_NET.$n:$PORT (pid $(cat "$pidfile"))"
}

mig_env() {
  local hosts=() d
  for d in "$MIG"/m*; do
    [ -d "$d" ] || continue
    alive "$RUN/sshd-m${d##*/m}.pid" "$d/sshd_config" && hosts+=("${d##*/m}")
  done
  "$PYTHON" - "$MIG/hosts.json" "$MIG" "$PORT" "$SSH_DIR" "$MIG_NET" "$RUN" "${hosts[@]}" <<'EOF'
import json, os, sys
env_file, mig, port, ssh_dir, net, run, *hosts = sys.argv[1:]
identity = os.path.join(ssh_dir, "id_ed25519")
wrapper = os.path.join(mig, "ssh-wrapper")
def host(i):
    addr = "%s.%s" % (net, i)
    d = os.path.join(mig, "m" + i)
    return {"name": "m" + i, "ssh_host": addr, "ssh_port": int(port), "identity": identity,
            "known_hosts": os.path.join(mig, "known_hosts"), "ssh_wrapper": wrapper,
            "libvirt_uri": "qemu+ssh://root@%s:%s/system?keyfile=%s&command=%s" % (addr, port, identity, wrapper),
            "libvirtd_pidfile": os.path.join(d, "libvirtd.pid"), "libvirtd_log": os.path.join(run, "libvirtd-m%s.log" % i),
            "sshd_log": os.path.join(run, "sshd-m%s.log" % i),
            "host_uuid": "76677075-7669-7274-6d69-%012x" % int(i)}
tmp = env_file + ".tmp"
with open(tmp, "w") as f:
    json.dump({"hosts": [host(i) for i in sorted(hosts, key=int)]}, f, indent=1)
os.replace(tmp, env_file)
EOF
}

mig_up() {
  local n=${1:-} i
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 12)) || die "usage: $0 mig-up N (1..12)" 2
  need_root; need_bins
  command -v nsenter >/dev/null || die "missing nsenter: run scripts/testbed.sh install first" 4
  [ -f "$ENV_FILE" ] || start
  take_lock
  prep_libvirt
  for i in $(seq 1 "$n"); do mig_conf "$i"; done
  mig_known_hosts
  for i in $(seq 1 "$n"); do mig_start "$i"; done
  for i in $(seq 1 "$n"); do mig_daemons "$i"; done
  mig_env
  log "migration hosts ready: $MIG/hosts.json"
}

mig_libvirtd_down() {
  local n=${1:-}
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 12)) || die "usage: $0 mig-libvirtd-down N (1..12)" 2
  need_root; take_lock
  stop_pidfile "libvirtd m$n" "$MIG/m$n/libvirtd.pid" "$MIG/m$n/etc/libvirtd.conf"
}

mig_down() {
  local d n pidf
  need_root; take_lock
  for d in "$MIG"/m*; do
    [ -d "$d" ] || continue
    n=${d##*/m}
    # libvirtd first: on SIGTERM it leaves its QEMUs running; those of a stopped test host are ours to end
    stop_pidfile "libvirtd m$n" "$d/libvirtd.pid" "$d/etc/libvirtd.conf"
    for pidf in "$d"/run/qemu/*.pid; do
      [ -e "$pidf" ] && stop_pidfile "qemu m$n ${pidf##*/}" "$pidf" qemu-system
    done
    stop_pidfile "virtlogd m$n" "$d/virtlogd.pid" "$d/etc/virtlogd.conf"
    stop_pidfile "sshd m$n" "$RUN/sshd-m$n.pid" "$d/sshd_config"
  done
  [ -d "$MIG" ] && mig_env
  return 0
}

# ---------------------------------------------------------------- start / stop
# libvirt_answers: libvirtd answers an API call on $LIBVIRT_URI (its socket is live, not just its pid).
libvirt_answers() { virsh -q -c "$LIBVIRT_URI" version >/dev/null 2>&1; }

# root_libvirtd: the pids of libvirtds that are not a migration host's (those run in namespaces of their own
# and never touch /run/libvirt's sockets); exit 1 when there is none.
root_libvirtd() {
  local p f found=1 mine
  for p in $(pgrep -x libvirtd); do
    mine=
    for f in "$MIG"/m*/libvirtd.pid; do [ -s "$f" ] && [ "$(cat "$f")" = "$p" ] && mine=1; done
    [ -n "$mine" ] || { echo "$p"; found=0; }
  done
  return $found
}

# libvirt_state: where libvirtd stands, read-only:
#   ours     the libvirtd of our pid file runs and answers      foreign  one we did not start answers
#   silent   a libvirtd process runs but does not answer (starting up, hung, or on other sockets): a second
#            libvirtd would fight it over /run/libvirt's sockets and pid file, so `start` never launches one
#   none     no libvirtd process: `start` launches one
libvirt_state() {
  if libvirt_answers; then
    if alive "$RUN/libvirtd.pid" "$RUN/libvirtd.pid"; then echo ours; else echo foreign; fi
  elif alive "$RUN/libvirtd.pid" "$RUN/libvirtd.pid" || root_libvirtd >/dev/null; then echo silent
  else echo none; fi
}

start_libvirt() {
  if alive "$RUN/virtlogd.pid" "$RUN/virtlogd.pid"; then :
  elif pgrep -x virtlogd >/dev/null; then log "virtlogd: one we did not start is running; using it"
  else virtlogd -d -p "$RUN/virtlogd.pid" 9>&-; log "virtlogd started"; fi

  local state i
  state=$(libvirt_state)
  if [ "$state" = silent ]; then
    log "libvirtd: a libvirtd runs but does not answer on $LIBVIRT_URI; waiting up to $LIBVIRT_WAIT s for it"
    for i in $(seq 1 $((LIBVIRT_WAIT * 10))); do libvirt_answers && break; sleep 0.1; done
    state=$(libvirt_state)
    [ "$state" != silent ] || die "libvirtd (pid $(root_libvirtd | tr '\n' ' '| sed 's/ $//')) runs but does not answer on $LIBVIRT_URI: not starting a second one over its sockets; stop it or see $RUN/libvirtd.log" 5
  fi
  case $state in
    ours) return 0 ;;
    foreign) log "libvirtd: one we did not start answers on $LIBVIRT_URI; using it"; return 0 ;;
  esac
  LIBVIRT_LOG_OUTPUTS="3:file:$RUN/libvirtd.log" libvirtd -d --pid-file "$RUN/libvirtd.pid" 9>&-
  for i in $(seq 1 600); do libvirt_answers && break; sleep 0.05; done
  libvirt_answers || { tail -20 "$RUN/libvirtd.log" >&2; die "libvirtd did not answer"; }
  log "libvirtd ready on $LIBVIRT_URI (pid $(cat "$RUN/libvirtd.pid"))"   # cold ~8 s: QEMU capability probe
}

# All mounts here are private (no systemd): make $MNT a shared mount point so that FUSE trees mounted
# below it later propagate into the sshd namespaces (which are slaves).
share_mnt() {
  mkdir -p "$MNT"
  mountpoint -q "$MNT" || mount --bind "$MNT" "$MNT"
  mount --make-shared "$MNT"
}

write_env() {
  local hosts=() d i
  for d in "$SBX"/hosts/h*; do
    [ -d "$d" ] || continue
    i=${d##*/h}
    alive "$RUN/sshd-h$i.pid" "$d/sshd_config" && hosts+=("$i")
  done
  "$PYTHON" - "$ENV_FILE" "$SBX" "$PORT" "$SSH_DIR" "$MNT" "$LIBVIRT_URI" "$EXTRA_NET" "$RUN" "${hosts[@]}" <<'EOF'
import json, os, sys
env_file, sbx, port, ssh_dir, mnt, uri, net, run, *hosts = sys.argv[1:]
port = int(port)
identity = os.path.join(ssh_dir, "id_ed25519")
wrapper = os.path.join(ssh_dir, "ssh-wrapper")
data = {
    "sbx": sbx, "ssh_host": "127.0.0.1", "ssh_port": port, "ssh_user": "root", "identity": identity,
    "known_hosts": os.path.join(ssh_dir, "known_hosts"), "mnt_dir": mnt, "libvirt_uri": uri,
    "libvirt_ssh_uri": "qemu+ssh://root@127.0.0.1:%d/system?keyfile=%s&command=%s" % (port, identity, wrapper),
    "ssh_wrapper": wrapper, "sshd_log": os.path.join(run, "sshd-main.log"),
    "libvirtd_pidfile": os.path.join(run, "libvirtd.pid"), "libvirtd_log": os.path.join(run, "libvirtd.log"),
    "hosts": [{"name": "h" + i, "ssh_host": "%s.%s" % (net, i), "ssh_port": port,
               "mnt_dir": os.path.join(mnt, "h" + i), "sshd_log": os.path.join(run, "sshd-h%s.log" % i)}
              for i in sorted(hosts, key=int)],
}
tmp = env_file + ".tmp"
with open(tmp, "w") as f:
    json.dump(data, f, indent=1)
os.replace(tmp, env_file)
EOF
}

start() {
  need_root; need_bins; take_lock
  prep_libvirt
  prep_ssh
  start_libvirt
  share_mnt
  start_sshd main "$SSH_DIR" 127.0.0.1
  write_env
  log "ready: $ENV_FILE"
}

hosts_up() {
  local n=${1:-} i d
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 50)) || die "usage: $0 hosts-up N (1..50)" 2
  need_root; need_bins
  [ -f "$ENV_FILE" ] || start
  take_lock
  share_mnt
  for i in $(seq 1 "$n"); do
    d=$SBX/hosts/h$i
    mkdir -p "$d" "$MNT/h$i"
    [ -f "$d/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C "vgpuvirt-testbed-h$i" -f "$d/host_ed25519"
    sshd_config "$d" "$EXTRA_NET.$i" "h$i"
  done
  write_known_hosts
  for i in $(seq 1 "$n"); do start_sshd "h$i" "$SBX/hosts/h$i" "$EXTRA_NET.$i"; done
  write_env
}

hosts_down() {
  local d
  need_root; take_lock
  for d in "$SBX"/hosts/h*; do
    [ -d "$d" ] || continue
    stop_pidfile "sshd ${d##*/}" "$RUN/sshd-${d##*/}.pid" "$d/sshd_config"
  done
  [ -f "$ENV_FILE" ] && write_env
  return 0
}

host_down() {
  local n=${1:-} d
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 50)) || die "usage: $0 host-down N (1..50)" 2
  need_root; take_lock
  d=$SBX/hosts/h$n
  [ -d "$d" ] && stop_pidfile "sshd h$n" "$RUN/sshd-h$n.pid" "$d/sshd_config"
  [ -f "$ENV_FILE" ] && write_env
  return 0
}

stop() {
  need_root; take_lock
  hosts_down
  mig_down
  stop_pidfile "sshd main" "$RUN/sshd-main.pid" "$SSH_DIR/sshd_config"
  stop_pidfile libvirtd "$RUN/libvirtd.pid" "$RUN/libvirtd.pid"
  stop_pidfile virtlogd "$RUN/virtlogd.pid" "$RUN/virtlogd.pid"
  # leave $MNT mounted while something (a FUSE tree of a running test) is still mounted below it
  if mountpoint -q "$MNT" && ! grep -qF " $MNT/" /proc/self/mountinfo; then umount "$MNT"; fi
  rm -f "$ENV_FILE"
}

status() {
  local ok=0 f d
  show() {  # show NAME PIDFILE WORD
    if alive "$2" "$3"; then echo "$1: running (pid $(cat "$2"))"; else echo "$1: stopped"; return 1; fi
  }
  show "sshd 127.0.0.1:$PORT" "$RUN/sshd-main.pid" "$SSH_DIR/sshd_config" || ok=1
  # a live pid is not a working libvirtd: ask it over its socket
  case $(libvirt_state) in
    ours)    echo "libvirtd: running (pid $(cat "$RUN/libvirtd.pid")), answers on $LIBVIRT_URI" ;;
    foreign) echo "libvirtd: one we did not start answers on $LIBVIRT_URI" ;;
    silent)  echo "libvirtd: runs (pid $(root_libvirtd | tr '\n' ' ' | sed 's/ $//')) but does NOT answer on $LIBVIRT_URI"; ok=1 ;;
    none)    echo "libvirtd: stopped"; ok=1 ;;
  esac
  show virtlogd "$RUN/virtlogd.pid" "$RUN/virtlogd.pid" || true
  for d in "$SBX"/hosts/h*; do
    [ -d "$d" ] || continue
    f=${d##*/}
    show "sshd $f $EXTRA_NET.${f#h}:$PORT" "$RUN/sshd-$f.pid" "$d/sshd_config" || true
  done
  for d in "$MIG"/m*; do
    [ -d "$d" ] || continue
    f=${d##*/}
    show "migration host $f sshd $MIG_NET.${f#m}:$PORT" "$RUN/sshd-$f.pid" "$d/sshd_config" || true
    show "migration host $f libvirtd" "$d/libvirtd.pid" "$d/etc/libvirtd.conf" || true
  done
  if mountpoint -q "$MNT" && grep -qE "^[0-9]+ [0-9]+ [^ ]+ [^ ]+ $MNT .*shared:" /proc/self/mountinfo; then
    echo "mnt $MNT: shared mount"
  else
    echo "mnt $MNT: not a shared mount"; ok=1
  fi
  [ -f "$ENV_FILE" ] && echo "env: $ENV_FILE" || echo "env: none"
  return $ok
}

t0=$EPOCHREALTIME
case "${1:-}" in
  install)  need_root; take_lock; install_apt; prep_libvirt; install_venv ;;
  start)    start ;;
  stop)     stop ;;
  status)   status; exit $? ;;
  libvirt-state) libvirt_state; exit 0 ;;
  hosts-up|netns-up)     hosts_up "${2:-}" ;;
  hosts-down|netns-down) hosts_down ;;
  host-down)             host_down "${2:-}" ;;
  mig-up)                mig_up "${2:-}" ;;
  mig-down)              mig_down ;;
  mig-libvirtd-down)     mig_libvirtd_down "${2:-}" ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
log "$1 done in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }') s"
