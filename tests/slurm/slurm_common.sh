# Sourced by the Slurm test clusters (start_cluster.sh: one node; run_slurm_nodes.sh: several
# "nodes" in network namespaces). Needs: apt-get install slurmctld slurmd slurm-client munge.
#   start_munge                 starts munged once (a key is made when there is none)
#   slurm_conf_common DIR       prints the slurm.conf lines both clusters share: plugins without
#                               cgroups or systemd, root as the Slurm user, state and logs in DIR,
#                               and the fast turnaround a test needs (requeued jobs eligible again
#                               after cred_expire + 1 s, the schedulers every second)

start_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none   # (or: mungekey -c)
  fi
  chown -R munge:munge /etc/munge; chmod 700 /etc/munge; chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    # runs as the munge user (Debian's default); --force tolerates odd perms in containers
    su -s /bin/sh munge -c "/usr/sbin/munged --force" || /usr/sbin/munged --force
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  munge -n | unmunge >/dev/null
}

slurm_conf_common() {
  cat <<CONF
ClusterName=vidit
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
# requeued jobs wait cred_expire+1 s before they are eligible again (default 120)
AuthInfo=cred_expire=${SLURM_CRED_EXPIRE:-5}
StateSaveLocation=$1/state
SlurmctldPidFile=$1/slurmctld.pid
SlurmctldLogFile=$1/log/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldPort=6817
SlurmdPort=6818
SchedulerType=sched/backfill
# requeued/BeginTime jobs are only picked up by the periodic schedulers (defaults 60 s and 30 s)
SchedulerParameters=sched_interval=1,bf_interval=1
MessageTimeout=10
KillWait=5
MinJobAge=300
InactiveLimit=0
Waittime=0
OverTimeLimit=0
SlurmctldTimeout=60
CONF
}

# The hardware line of this machine for slurm.conf (slurmd -C), with 10% of its memory held back
# so slurmd never reports "low RealMemory"; NodeName=... is the first field.
slurm_node_line() {
  local line mem
  line=$(slurmd -C | head -1)
  mem=$(echo "$line" | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  echo "$line" | sed "s/RealMemory=[0-9]*/RealMemory=$((mem * 9 / 10))/"
}
