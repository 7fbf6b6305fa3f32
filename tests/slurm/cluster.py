"""A single-node Slurm cluster for the `slurm` test, from Debian's packages (slurm-wlm, slurmdbd,
mariadb-server, munge): munged, MariaDB, slurmdbd, slurmctld and slurmd, each started by this script
in the foreground, with every file (keys, configs, state, logs, pids) in one directory, and each
stopped by its own pid. The node is sized from this machine (`slurmd -C`); two partitions, `cpu`
(the default) and `gpu`, both on it, as profiles/slurm/partitions.yaml names them.

    python tests/slurm/cluster.py start DIR   # prints SLURM_CONF=DIR/slurm.conf
    python tests/slurm/cluster.py stop DIR

Needs root (the daemons run as root) and the packages; unavailable() says what is missing.
slurmdbd is needed: the slurm executor polls its jobs with `sacct`, which reads the accounting database.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CLUSTER = "estest"
PROGRAMS = ("munged", "mariadbd", "mariadb-install-db", "mariadb", "slurmdbd", "slurmctld", "slurmd",
            "sacctmgr", "sinfo", "sbatch", "sacct", "scancel", "squeue")
# Start order; stop() goes backwards.
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")
DB_PASSWORD = secrets.token_hex(8)


class ClusterError(RuntimeError):
    """A daemon did not start or answer; the message ends with its log's last lines."""


def unavailable() -> str | None:
    """Why no cluster can be started here (not root, a program missing), or None."""
    if os.geteuid() != 0:
        return "not root: the Slurm daemons run as root"
    missing = [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if missing:
        return ("missing " + ", ".join(missing) + " (apt-get install -y slurm-wlm slurmdbd mariadb-server"
                " munge)")
    return None


def environment(root: Path) -> dict[str, str]:
    """The environment of every Slurm command and daemon: SLURM_CONF names this cluster's config, and
    root/bin (srun, see write_configs) comes first on the PATH."""
    return dict(os.environ, SLURM_CONF=str(root / "slurm.conf"),
                PATH=os.pathsep.join([str(root / "bin"), os.environ.get("PATH", ""), "/usr/sbin"]))


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _node_line(name: str) -> str:
    """This machine as a Slurm node (`slurmd -C`: CPUs, sockets, cores, threads, memory)."""
    measured = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    fields = next(line for line in measured.splitlines() if line.startswith("NodeName="))
    sizes = " ".join(f for f in fields.split() if not f.startswith("NodeName="))
    return f"NodeName={name} NodeAddr=127.0.0.1 {sizes} State=UNKNOWN"


def write_configs(root: Path) -> None:
    """slurm.conf and slurmdbd.conf (beside it, where slurmdbd looks) for a cluster in `root`."""
    db_port, dbd_port, ctld_port, slurmd_port = _free_ports(4)
    host = socket.gethostname().split(".")[0]
    munge = f"AuthType=auth/munge\nAuthInfo=socket={root}/munge/munge.socket\n"
    (root / "ports").write_text(f"{db_port}\n")
    (root / "slurmdbd.conf").write_text(
        munge + f"DbdHost=localhost\nDbdPort={dbd_port}\nSlurmUser=root\nPidFile={root}/slurmdbd.pid\n"
        f"LogFile={root}/slurmdbd.log\nStorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\n"
        f"StoragePort={db_port}\nStorageUser=slurm\nStoragePass={DB_PASSWORD}\nStorageLoc=slurm_acct_db\n")
    (root / "slurmdbd.conf").chmod(0o600)
    (root / "slurm.conf").write_text(
        munge + f"ClusterName={CLUSTER}\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={ctld_port}\n"
        f"SlurmdPort={slurmd_port}\nSlurmUser=root\nSlurmdUser=root\nCredType=cred/munge\n"
        f"StateSaveLocation={root}/state\nSlurmdSpoolDir={root}/spool\n"
        f"SlurmctldPidFile={root}/slurmctld.pid\nSlurmdPidFile={root}/slurmd.pid\n"
        f"SlurmctldLogFile={root}/slurmctld.log\nSlurmdLogFile={root}/slurmd.log\n"
        # No cgroups in a container: processes tracked through /proc, no CPU binding.
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core_Memory\nReturnToService=2\n"
        "JobAcctGatherType=jobacct_gather/linux\nAccountingStorageType=accounting_storage/slurmdbd\n"
        # sacct then shows the comment the slurm executor gives each job (rule_<rule>_wildcards_...).
        "AccountingStoreFlags=job_comment\n"
        f"AccountingStorageHost=localhost\nAccountingStoragePort={dbd_port}\n"
        # For the connection to slurmdbd, the munge socket is given as its "password".
        f"AccountingStoragePass={root}/munge/munge.socket\n"
        f"{_node_line(host)}\n"
        f"PartitionName=cpu Nodes={host} Default=YES MaxTime=INFINITE State=UP\n"
        f"PartitionName=gpu Nodes={host} MaxTime=INFINITE State=UP\n")
    for part in ("state", "spool", "munge", "db", "bin"):
        (root / part).mkdir(mode=0o700, exist_ok=True)
    # The slurm executor's job step runs srun without the SLURM_* variables, so srun would look for
    # /etc/slurm/slurm.conf, where a real cluster's config is; this one's is here.
    srun = root / "bin" / "srun"
    srun.write_text(f"#!/bin/sh\nSLURM_CONF={root}/slurm.conf exec {shutil.which('srun')} \"$@\"\n")
    srun.chmod(0o755)
    key = root / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)


def _start(root: Path, name: str, command: list[str]) -> None:
    log = open(root / f"{name}.out", "ab")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env=environment(root), start_new_session=True)
    (root / f"{name}.started").write_text(f"{process.pid}\n")


def _wait(root: Path, name: str, command: list[str], timeout: float, says: str = "") -> None:
    """Until `command` succeeds (and prints `says`), or raise with the daemon's log."""
    deadline = time.monotonic() + timeout
    while True:
        result = subprocess.run(command, capture_output=True, text=True, env=environment(root))
        if result.returncode == 0 and says in result.stdout:
            return
        if time.monotonic() > deadline or not _alive(root, name):
            logs = [root / f"{name}.out", root / f"{name}.log", root / "db" / "mariadb.err"]
            tail = "".join(p.read_text(errors="replace")[-1500:] for p in logs if p.is_file())
            raise ClusterError(f"{name} did not come up ({' '.join(command)}: {result.stderr.strip()}"
                               f"{result.stdout.strip()}):\n{tail}")
        time.sleep(1)


def _alive(root: Path, name: str) -> bool:
    pid = _pid(root, name)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child counts as gone.
    state = Path(f"/proc/{pid}/stat")
    return not (state.is_file() and state.read_text().split(") ", 1)[-1].startswith("Z"))


def _pid(root: Path, name: str) -> int | None:
    started = root / f"{name}.started"
    return int(started.read_text()) if started.is_file() else None


def _database(root: Path, timeout: float) -> None:
    """A MariaDB server on 127.0.0.1 with an empty accounting database and the user slurmdbd uses."""
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={root}/db/data", "--user=root",
                    "--auth-root-authentication-method=socket", "--skip-test-db"],
                   capture_output=True, check=True, env=environment(root))
    port = int((root / "ports").read_text())
    _start(root, "mariadbd", ["mariadbd", "--no-defaults", f"--datadir={root}/db/data", "--user=root",
                              f"--socket={root}/db/mysql.sock", f"--port={port}", "--bind-address=127.0.0.1",
                              f"--pid-file={root}/db/mariadbd.pid", f"--log-error={root}/db/mariadb.err",
                              "--innodb-buffer-pool-size=32M", "--skip-name-resolve"])
    client = ["mariadb", "--no-defaults", f"--socket={root}/db/mysql.sock", "-u", "root"]
    _wait(root, "mariadbd", client + ["-e", "SELECT 'up'"], timeout)
    grants = "".join(f"CREATE USER 'slurm'@'{host}' IDENTIFIED BY '{DB_PASSWORD}';"
                     f"GRANT ALL ON slurm_acct_db.* TO 'slurm'@'{host}';"
                     for host in ("127.0.0.1", "localhost"))
    subprocess.run(client + ["-e", "CREATE DATABASE slurm_acct_db;" + grants], check=True,
                   capture_output=True, env=environment(root))


def start(root: Path, timeout: float = 120) -> dict[str, str]:
    """Start the cluster in `root`; return the environment its commands need. On any failure, stop
    whatever started and raise ClusterError."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    env = environment(root)
    try:
        write_configs(root)
        munge = root / "munge"
        _start(root, "munged", ["munged", "--foreground", "--force", f"--key-file={munge}/munge.key",
                                f"--socket={munge}/munge.socket", f"--pid-file={munge}/munged.pid",
                                f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed"])
        _wait(root, "munged", ["sh", "-c", f"munge -n -S {munge}/munge.socket | unmunge"
                               f" -S {munge}/munge.socket"], timeout, "STATUS:")
        _database(root, timeout)
        _start(root, "slurmdbd", ["slurmdbd", "-D"])
        _wait(root, "slurmdbd", ["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"], timeout / 4)
        subprocess.run(["sacctmgr", "-i", "add", "cluster", CLUSTER], check=True, capture_output=True,
                       env=env)
        _start(root, "slurmctld", ["slurmctld", "-D", "-i", "-f", env["SLURM_CONF"]])
        _wait(root, "slurmctld", ["scontrol", "ping"], timeout / 4)
        _start(root, "slurmd", ["slurmd", "-D", "-f", env["SLURM_CONF"], "-N",
                                socket.gethostname().split(".")[0]])
        _wait(root, "slurmd", ["sinfo", "-h", "-N", "-p", "cpu", "-o", "%T"], timeout / 2, "idle")
    except (ClusterError, subprocess.CalledProcessError, OSError) as error:
        stop(root)
        raise ClusterError(str(error)) from error
    return env


def stop(root: Path, timeout: float = 30) -> None:
    """Cancel the cluster's jobs, then stop each daemon this script started (by its pid), last first."""
    root = Path(root).resolve()
    if _alive(root, "slurmctld"):
        subprocess.run(["scancel", "--full", "--cluster", CLUSTER, "--user", "root"], capture_output=True,
                       env=environment(root))
    for name in reversed(DAEMONS):
        pid = _pid(root, name)
        if pid is None or not _alive(root, name):
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(root, name) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(root, name):
            os.kill(pid, signal.SIGKILL)
        try:  # reap it when it is our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        (root / f"{name}.started").unlink()


if __name__ == "__main__":
    action, directory = sys.argv[1], Path(sys.argv[2])
    if action == "start":
        why = unavailable()
        if why:
            sys.exit(why)
        print(f"SLURM_CONF={start(directory)['SLURM_CONF']}")
    elif action == "stop":
        stop(directory)
    else:
        sys.exit(f"usage: {sys.argv[0]} start|stop DIR")
