"""A throwaway real Slurm cluster on this machine, for tests (stdlib only).

Two slurmd "nodes" (n1, n2) on 127.0.0.1, one slurmctld, slurmdbd with MariaDB accounting
(submitit polls `sacct`), and munged; every path (config, state, spool, logs, pid files, munge key
and socket, MariaDB data and socket) lives under one folder, and every port is picked free at
start-up, so two clusters on one machine do not collide. Needs root and the Debian packages:

    apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge slurmdbd mariadb-server

Python:  cluster = SlurmCluster.up(tmp_dir); subprocess.run([...], env={**os.environ, **cluster.env})
         ...; cluster.down()
Shell:   eval "$(python -m tests.slurm.cluster up /tmp/slurm)"; srun -N2 -n4 hostname
         python -m tests.slurm.cluster down /tmp/slurm

Each node has CPUs=2 (so `srun -N2 -n4` puts ranks 0-1 on n1 and 2-3 on n2; the real cores are
shared by both nodes, allowed by `SlurmdParameters=config_overrides`), and the partition has
`OverSubscribe=FORCE:4`, so up to four jobs share a core and concurrent test jobs do not queue.
`KillWait=5` (Slurm's default 30: SIGTERM to SIGKILL), `cred_expire=5` (default 120, and the least
Slurm accepts: how long a requeued job waits before it may start again) and 1 s scheduler
intervals (defaults 60/30 s) keep cancel and requeue tests short.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.slurm.cluster_layout import (  # noqa: F401  (INSTALL_HINT, missing_binaries: conftest's)
    ACCOUNT, CLUSTER_NAME, DB_NAME, DB_PASS, DB_USER, INSTALL_HINT, NODES, ClusterError, Layout,
    dbd_conf, find_binary, missing_binaries, slurm_conf,
)
from tests.support.processes import pid_alive

def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class SlurmCluster:
    """A running test cluster. Build it with `SlurmCluster.up(dir)`; stop it with `.down()`."""

    root: Path
    ports: dict[str, int]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    # ----------------------------------------------------------------------------- public API
    @property
    def env(self) -> dict[str, str]:
        """Environment every Slurm client (and submitit) needs: `{"SLURM_CONF": ...}`."""
        return {"SLURM_CONF": str(Layout(self.root).slurm_conf)}

    @property
    def nodes(self) -> tuple[str, ...]:
        return NODES

    @classmethod
    def up(cls, root: str | os.PathLike, timeout_s: float = 60.0) -> "SlurmCluster":
        """Start munged, MariaDB, slurmdbd, slurmctld and two slurmd under `root`.

        Returns once `sinfo` shows both nodes idle and `sacctmgr` answers. Raises ClusterError
        (with log tails) and stops whatever started if that does not happen in `timeout_s`.
        """
        missing = missing_binaries()
        if missing:
            raise ClusterError(f"missing Slurm binaries {missing}; install with:\n  {INSTALL_HINT}")
        lay = Layout(Path(root))
        if _live_daemon_pids(lay):
            raise ClusterError(f"a cluster is already running under {lay.root}; run down first")
        lay.reset()
        names = ["slurmctld", "slurmdbd", "mariadb", *NODES]
        ports = dict(zip(names, _free_ports(len(names))))
        lay.slurm_conf.write_text(slurm_conf(lay, ports))
        lay.dbd_conf.write_text(dbd_conf(lay, ports))
        lay.dbd_conf.chmod(0o600)
        lay.ports_file.write_text(json.dumps(ports))
        cluster = cls(root=lay.root, ports=ports)
        try:
            cluster._start(lay, time.monotonic() + timeout_s)
        except BaseException as err:
            tails = cluster.logs_tail()
            cluster.down()
            if isinstance(err, ClusterError):
                raise ClusterError(f"{err}\n{tails}") from None
            raise
        return cluster

    @classmethod
    def attach(cls, root: str | os.PathLike) -> "SlurmCluster":
        """A handle on a cluster started earlier (e.g. by the CLI) under `root`."""
        lay = Layout(Path(root))
        ports = json.loads(lay.ports_file.read_text()) if lay.ports_file.exists() else {}
        return cls(root=lay.root, ports=ports)

    def down(self, timeout_s: float = 20.0) -> None:
        """Stop every daemon (SIGTERM, then SIGKILL after `timeout_s`) and wait until all are gone.

        Stops job processes first (scancel), then slurmd, slurmctld, slurmdbd, MariaDB, munged.
        """
        lay = Layout(self.root)
        live = _live_daemon_pids(lay)
        if "slurmctld" in live:
            subprocess.run([find_binary("scancel") or "scancel", "--full", "--user=root"],
                           env={**os.environ, **self.env}, capture_output=True, timeout=15)
        order = [f"slurmd-{n}" for n in NODES] + ["slurmctld", "slurmdbd", "mariadbd", "munged"]
        for name in order:
            proc = self.procs.get(name)
            pids = {p for p in (live.get(name), proc.pid if proc else None) if p}
            _stop(pids, proc, timeout_s)
        _kill_leftover_steps(lay)
        for p in self.procs.values():
            p.poll()
        self.procs.clear()
        for f in lay.run.glob("*.pid") if lay.run.exists() else ():
            f.unlink(missing_ok=True)

    def logs_tail(self, lines: int = 30) -> str:
        """The last `lines` of every daemon log, for debugging a failed start or test."""
        out = []
        log = Layout(self.root).log
        for f in sorted([*log.glob("*.log"), *log.glob("*.stdout")]):
            text = f.read_text(errors="replace").splitlines()[-lines:]
            if not text:
                continue
            out.append(f"==== {f.name} ====\n" + "\n".join(text))
        return "\n".join(out)

    def run(self, *args: str, timeout_s: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run a Slurm client command (`cluster.run("sinfo", "-N")`) with this cluster's env."""
        exe = find_binary(args[0]) or args[0]
        return subprocess.run([exe, *args[1:]], env={**os.environ, **self.env}, text=True,
                              capture_output=True, timeout=timeout_s, check=check)

    # ------------------------------------------------------------------------------ start-up
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        lay = Layout(self.root)
        out = open(lay.log / f"{name}.stdout", "ab")
        exe = find_binary(argv[0]) or argv[0]
        self.procs[name] = subprocess.Popen(
            [exe, *argv[1:]], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, **self.env, **(env or {})}, start_new_session=True, cwd=lay.root)
        out.close()

    def _wait(self, what: str, ok, deadline: float, procs: tuple[str, ...] = ()) -> None:
        while True:
            if ok():
                return
            for name in procs:
                if self.procs[name].poll() is not None:
                    raise ClusterError(f"{name} exited with {self.procs[name].returncode} "
                                       f"while waiting for {what}")
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def _start(self, lay: Layout, deadline: float) -> None:
        if not lay.munge_key.exists():
            lay.munge_key.write_bytes(os.urandom(1024))
        lay.munge_key.chmod(0o400)
        self._spawn("munged", ["munged", "-F", "--force", f"--key-file={lay.munge_key}",
                               f"--socket={lay.munge_socket}", f"--pid-file={lay.pid_file('munged')}",
                               f"--log-file={lay.log_file('munged')}",
                               f"--seed-file={lay.munge / 'munged.seed'}", "--num-threads=4"])
        self._start_mariadb(lay, deadline)
        self._wait("munged socket", lay.munge_socket.exists, deadline, ("munged",))
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._wait("slurmdbd port", lambda: _port_open(self.ports["slurmdbd"]), deadline, ("slurmdbd",))
        # Register cluster, account and user before slurmctld starts, so it finds its associations.
        self._sacctmgr("add", "cluster", CLUSTER_NAME)
        self._sacctmgr("add", "account", ACCOUNT, f"cluster={CLUSTER_NAME}", "description=tests",
                       "organization=meshrun")
        self._sacctmgr("add", "user", "root", f"account={ACCOUNT}", f"defaultaccount={ACCOUNT}",
                       f"cluster={CLUSTER_NAME}")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self._wait("slurmctld port", lambda: _port_open(self.ports["slurmctld"]), deadline, ("slurmctld",))
        for n in NODES:
            self._spawn(f"slurmd-{n}", ["slurmd", "-D", "-N", n])
        procs = ("slurmctld", *(f"slurmd-{n}" for n in NODES))
        self._wait("both nodes idle in sinfo", self._nodes_idle, deadline, procs)
        self._wait("sacctmgr to list the cluster", self._accounting_ok, deadline, ("slurmdbd",))

    def _start_mariadb(self, lay: Layout, deadline: float) -> None:
        if not (lay.db_data / "mysql").exists():
            r = subprocess.run(
                [find_binary("mariadb-install-db"), "--no-defaults", f"--datadir={lay.db_data}",
                 "--user=root", "--auth-root-authentication-method=socket", "--skip-test-db",
                 "--innodb-log-file-size=8M"],
                capture_output=True, text=True, cwd=lay.root)
            if r.returncode != 0:
                raise ClusterError(f"mariadb-install-db failed:\n{r.stdout}\n{r.stderr}")
        self._spawn("mariadbd", [
            "mariadbd", "--no-defaults", f"--datadir={lay.db_data}", f"--socket={lay.db_socket}",
            f"--port={self.ports['mariadb']}", "--bind-address=127.0.0.1", "--user=root",
            f"--pid-file={lay.pid_file('mariadbd')}", f"--log-error={lay.log_file('mariadbd')}",
            "--skip-name-resolve", "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M",
            "--skip-log-bin", "--innodb-flush-log-at-trx-commit=0"])
        self._wait("mariadbd socket", lay.db_socket.exists, deadline, ("mariadbd",))
        sql = "".join(
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'{h}' IDENTIFIED BY '{DB_PASS}';"
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'{h}';"
            for h in ("127.0.0.1", "localhost"))
        self._mysql(lay, sql + "FLUSH PRIVILEGES;", deadline)

    def _mysql(self, lay: Layout, sql: str, deadline: float) -> None:
        while True:
            r = subprocess.run([find_binary("mariadb"), "--no-defaults", f"--socket={lay.db_socket}",
                                "-uroot", "-e", sql], capture_output=True, text=True)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline or self.procs["mariadbd"].poll() is not None:
                raise ClusterError(f"MariaDB setup failed: {r.stderr.strip()}")
            time.sleep(0.1)

    def _sacctmgr(self, *args: str) -> None:
        r = self.run("sacctmgr", "-i", *args, check=False)
        if r.returncode != 0 and "Nothing new added" not in r.stdout + r.stderr:
            raise ClusterError(f"sacctmgr {' '.join(args)} failed: {r.stdout}{r.stderr}")

    def _nodes_idle(self) -> bool:
        r = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout_s=10)
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return r.returncode == 0 and all(states.get(n) == "idle" for n in NODES)

    def _accounting_ok(self) -> bool:
        r = self.run("sacctmgr", "-n", "-P", "show", "cluster", "format=cluster", check=False)
        return r.returncode == 0 and CLUSTER_NAME in r.stdout.split()


def _live_daemon_pids(lay: Layout) -> dict[str, int]:
    """Daemon name (pid file stem, e.g. "slurmd-n1") -> pid, for pid files whose process is alive
    and still runs that daemon (a stale pid file whose pid was reused is ignored)."""
    pids = {}
    for f in lay.run.glob("*.pid") if lay.run.exists() else ():
        try:
            pid = int(f.read_text().split()[0])
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except (ValueError, IndexError, OSError):
            continue
        if pid_alive(pid) and os.path.basename(argv0.decode(errors="replace")) == f.stem.split("-")[0]:
            pids[f.stem] = pid
    return pids


def _stop(pids: set[int], proc: subprocess.Popen | None, timeout_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + (timeout_s if sig == signal.SIGTERM else 5)
        while time.monotonic() < end:
            if proc is not None:
                proc.poll()
            if not any(pid_alive(p) for p in pids):
                return
            time.sleep(0.05)


def _kill_leftover_steps(lay: Layout) -> None:
    """SIGKILL every slurmstepd of this cluster (found by its SLURM_CONF) and its process tree."""
    marker = f"SLURM_CONF={lay.slurm_conf}".encode()
    children: dict[int, list[int]] = {}
    roots = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(proc.name))
            if b"slurmstepd" in (proc / "cmdline").read_bytes() and marker in (proc / "environ").read_bytes():
                roots.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    todo, doomed = list(roots), []
    while todo:
        pid = todo.pop()
        doomed.append(pid)
        todo.extend(children.get(pid, []))
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.slurm.cluster", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("up", "down", "logs"):
        sub.add_parser(cmd).add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "up":
        t0 = time.monotonic()
        try:
            cluster = SlurmCluster.up(args.dir)
        except ClusterError as err:
            print(err, file=sys.stderr)
            return 1
        print(f"export SLURM_CONF={cluster.env['SLURM_CONF']}", flush=True)
        print(f"# cluster up in {time.monotonic() - t0:.1f} s; stop with: "
              f"python -m tests.slurm.cluster down {cluster.root}", file=sys.stderr)
    elif args.cmd == "down":
        SlurmCluster.attach(args.dir).down()
    else:
        print(SlurmCluster.attach(args.dir).logs_tail())
    return 0


if __name__ == "__main__":
    sys.exit(main())
