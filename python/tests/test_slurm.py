"""The digits example under a real Slurm: a single-node cluster of our own
(munged, slurmctld and slurmd from Debian's munge, slurmctld, slurmd and
slurm-client, with a private configuration, ports and state directory),
started here and stopped after; the 4 trainers are one `srun -n 4` step
and find their rank in SLURM_PROCID/SLURM_NTASKS.  Skipped without those
programs or without root (slurmd launches the tasks)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import digits
from rdmaps.local import LocalServers

PROGRAMS = ["munged", "slurmctld", "slurmd", "srun", "sinfo"]


def _which(p):
    return shutil.which(p) or next((d + "/" + p for d in ("/usr/sbin", "/sbin") if os.access(d + "/" + p, os.X_OK)),
                                   None)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, what, procs, timeout=60):
    deadline = time.monotonic() + timeout
    while not cond():
        for name, p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited ({p.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout} s")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def slurm():
    missing = [p for p in PROGRAMS if not _which(p)]
    if missing:
        pytest.skip(f"no {', '.join(missing)} (apt-get install munge slurmctld slurmd slurm-client)")
    if os.geteuid() != 0:
        pytest.skip("a private slurmd needs root")
    d = tempfile.mkdtemp(prefix="rdmaps-slurm.")
    host = socket.gethostname()
    for sub in ("state", "spool", "munge"):
        os.mkdir(os.path.join(d, sub), 0o700)
    key = os.path.join(d, "munge", "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o400)
    sock = os.path.join(d, "munge", "munge.sock")
    conf = os.path.join(d, "slurm.conf")
    with open(conf, "w") as f:
        f.write(f"""ClusterName=rdmapstest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=rdmaps Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""")
    env = dict(os.environ, SLURM_CONF=conf)
    procs = []
    try:
        procs.append(("munged", subprocess.Popen(
            [_which("munged"), "-F", "--force", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={d}/munge/munged.pid", f"--log-file={d}/munge/munged.log", f"--seed-file={d}/munge/seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)))
        _wait(lambda: os.path.exists(sock), "munge socket", procs)
        for prog in ("slurmctld", "slurmd"):
            procs.append((prog, subprocess.Popen([_which(prog), "-D", "-f", conf], env=env,
                                                 stdout=open(os.path.join(d, prog + ".out"), "wb"),
                                                 stderr=subprocess.STDOUT)))

        def idle():
            r = subprocess.run([_which("sinfo"), "-h", "-o", "%t"], env=env, capture_output=True, text=True)
            return r.returncode == 0 and r.stdout.strip() in ("idle", "mix", "alloc")
        _wait(idle, "idle Slurm node", procs)
        yield env
    finally:
        for name, p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(d, ignore_errors=True)


def test_digits_under_srun(slurm, tmp_path):
    with LocalServers(2) as servers:
        env = dict(slurm, RDMAPS_SERVERS=servers.uris)
        for v in ("RANK", "WORLD_SIZE", "RDMAPS_RANK", "RDMAPS_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                  "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
            env.pop(v, None)
        # one output file per task: srun would interleave the long RESULT lines
        p = subprocess.run([_which("srun"), "-n", "4", "--overcommit", "--kill-on-bad-exit=1",
                            f"--output={tmp_path}/task.%t", sys.executable,
                            digits.__file__, "--worker", "--epochs", "15", "--quiet", "--json",
                            "--save", str(tmp_path / "final.npz")],
                           env=env, capture_output=True, text=True, timeout=300)
    outs = [(tmp_path / f"task.{i}").read_text() if (tmp_path / f"task.{i}").exists() else "" for i in range(4)]
    out = p.stdout + p.stderr + "".join(outs)
    assert p.returncode == 0, out
    res = [json.loads(l[len("RESULT "):]) for o in outs for l in o.splitlines() if l.startswith("RESULT ")]
    assert sorted((r["rank"], r["world"], r["source"]) for r in res) == [(i, 4, "slurm") for i in range(4)], out
    assert len({r["acc"] for r in res}) == 1 and res[0]["acc"] >= 0.95, out
