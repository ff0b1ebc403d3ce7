#!/usr/bin/env python3
"""gpucloud-run: a supervisor that restarts a training job from its newest valid checkpoint.

    gpucloud-run [options] -- mpirun -np 4 train_mlp --checkpoint-dir ck --resume
    python -m gpucloud.run [options] -- torchrun --nproc-per-node 2 train.py --resume
    python3 path/to/gpucloud/run.py ...          (the standard library is all it needs)

It starts the command (a launcher: mpirun, srun, torchrun, or one process) in a session of its
own and watches it. When the command fails (a rank died, a collective timed out, a rank stopped
beating its heartbeat for --hang-timeout seconds), every process left in that session is stopped
and the command starts again, after a backoff, up to --max-restarts times. The job resumes
itself: its command line carries --resume (or the trainer always resumes), and the checkpoint
library picks the newest checkpoint that verifies. Each launch sees GPUCLOUD_RESTART_COUNT,
GPUCLOUD_RESTART_REASON and GPUCLOUD_RUN_DIR (where gpucloud.elastic.JobControl beats).

A preemption (SIGTERM or SIGUSR1 to the supervisor: a cloud's notice, Slurm's --signal) is passed
on to the job (SIGUSR1 to mpirun and srun, which forward it; SIGTERM to torchrun), whose ranks
save at their current step and exit with status 75; the supervisor then exits with 75 too, which
deploy/slurm's job scripts answer with `scontrol requeue`. A job that ends with 75 by itself
(its ranks got the notice directly) is treated the same. Exit status: the job's, 75 for a
preemption, or the last failure's once the restarts are spent (its error shown again).

Elastic world size: with --nodes, the command places its ranks with the placeholders {hosts}
(NAME:SLOTS,...), {nodes} (NAME,...), {nnodes} and {np}, filled in at every launch from the nodes
that pass --node-check then. A node that is gone (dead, cut off) is left out, and the job restarts
on the nodes that remain, down to --min-nodes; one that answers again rejoins at the next launch,
up to --max-nodes. The checkpoints reshard, so the ranks load on the new world size.

docs/fault-tolerance.md describes the protocol and the measurements.
"""
import argparse
import collections
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

PREEMPTED_EXIT_CODE = 75  # gpucloud.elastic.PREEMPTED_EXIT_CODE (sysexits' EX_TEMPFAIL)
_LAUNCHERS_THAT_FORWARD_USR1 = ("mpirun", "mpiexec", "orterun", "prterun", "srun")


def _say(text):
    print(f"gpucloud-run: {text}", file=sys.stderr, flush=True)


def _session_processes(session):
    """The pids of the processes in session ``session`` (the launch's own and every process it
    started there, orphans included), from /proc."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # state, ppid, pgrp, session, ...
        if len(fields) > 3 and int(fields[3]) == session and fields[0] != b"Z":  # a zombie is gone
            pids.append(int(name))
    return pids


def _alive(pid):
    """False once ``pid`` has ended (gone, or a zombie its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


def _signal_all(pids, signo):
    for pid in pids:
        try:
            os.kill(pid, signo)
        except ProcessLookupError:
            pass


def _describe_status(code):
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


# What says best why a launch failed, in this order: the launcher naming a dead rank or node, gpucloud's
# own report (not its warnings: an OpenBLAS or checkpoint warning is no failure), a typed exception,
# an error not from srun's summary, any error; the last such line (a traceback ends with its error).
_ERROR_PATTERNS = [re.compile(p) for p in (r"exited on signal", r"lost communication with a remote daemon",
                                           r"^gpucloud: (?!warning: )", r"[A-Za-z]+Error\b",
                                           r"^(?!srun: ).*rror", r"rror")]


def _error_line(lines):
    for pattern in _ERROR_PATTERNS:
        for line in reversed(lines):
            if pattern.search(line):
                return line.strip()[:300]
    return ""


PLACEHOLDERS = ("{hosts}", "{nodes}", "{nnodes}", "{np}")


def parse_nodes(text, slots=1):
    """[(name, slots)] from ``NAME[:SLOTS],...``, or for ``@FILE`` from that file's lines (``NAME``,
    ``NAME:SLOTS`` or OpenMPI's ``NAME slots=N``; ``#`` starts a comment). ValueError names a bad entry."""
    if text.startswith("@"):
        with open(text[1:]) as f:
            entries = [line.split("#", 1)[0].strip() for line in f]
        where = f"{text[1:]}: "
    else:
        entries = [e.strip() for e in text.split(",")]
        where = ""
    nodes = []
    for entry in filter(None, entries):
        name, count = entry, slots
        words = entry.split()
        if len(words) == 2 and words[1].startswith("slots="):
            name, count = words[0], words[1][len("slots="):]
        elif ":" in entry:
            name, count = entry.rsplit(":", 1)
        try:
            count = int(count)
        except ValueError:
            count = 0
        if not name or " " in name or count < 1:
            raise ValueError(f"{where}{entry!r} is not NAME, NAME:SLOTS or NAME slots=SLOTS (SLOTS at least 1)")
        if name in (n for n, _ in nodes):
            raise ValueError(f"{where}{name!r} is listed twice")
        nodes.append((name, count))
    if not nodes:
        raise ValueError(f"{where}no node is listed")
    return nodes


def check_node(command, node, timeout):
    """(True, "") when ``command`` (a shell command; {node} is the node's name) exits 0 within
    ``timeout`` seconds, else (False, why)."""
    proc = subprocess.Popen(["/bin/sh", "-c", command.replace("{node}", shlex.quote(node))], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal_all([-proc.pid], signal.SIGKILL)
        proc.communicate()
        return False, f"--node-check did not answer in {timeout:g} s"
    if proc.returncode == 0:
        return True, ""
    last = [line for line in out.decode(errors="replace").splitlines() if line.strip()][-1:]
    return False, f"--node-check: {_describe_status(proc.returncode)}" + (f": {last[0].strip()[:200]}" if last else "")


class _NotEnoughNodes(Exception):
    pass


class NodePool:
    """The nodes a launch may use: --nodes (a file is read again before every launch), those that
    pass --node-check, at most --max-nodes, at least --min-nodes (waiting up to --node-wait s)."""

    def __init__(self, args):
        self.args = args
        self.spec = args.nodes
        parse_nodes(self.spec, args.nproc_per_node)  # a bad list fails before anything starts

    def choose(self, stopping):
        """([(name, slots)], {left-out name: why}); raises _NotEnoughNodes after --node-wait s."""
        import concurrent.futures

        deadline, said = time.monotonic() + self.args.node_wait, False
        while True:
            try:
                listed = parse_nodes(self.spec, self.args.nproc_per_node)
            except (OSError, ValueError) as e:  # the file is being rewritten, or was removed
                listed, why = [], {"--nodes": str(e)}
            else:
                why = {}
            if listed and self.args.node_check:
                with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(listed), 32)) as pool:
                    answers = list(pool.map(lambda n: check_node(self.args.node_check, n[0],
                                                                 self.args.node_check_timeout), listed))
                why.update({name: reason for (name, _), (ok, reason) in zip(listed, answers) if not ok})
            alive = [n for n in listed if n[0] not in why][:self.args.max_nodes or None]
            if len(alive) >= self.args.min_nodes:
                return alive, why
            if time.monotonic() >= deadline or stopping():
                raise _NotEnoughNodes(f"{len(alive)} node(s) pass --node-check, --min-nodes is "
                                      f"{self.args.min_nodes}; " + "; ".join(f"{n}: {w}" for n, w in why.items()))
            if not said:
                _say(f"waiting up to {self.args.node_wait:g} s for {self.args.min_nodes} node(s) "
                     f"({len(alive)} pass --node-check; " + "; ".join(f"{n}: {w}" for n, w in why.items()) + ")")
                said = True
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def placeholders(nodes):
    """{placeholder: value} for ``nodes`` [(name, slots)]."""
    return {"{hosts}": ",".join(f"{n}:{k}" for n, k in nodes), "{nodes}": ",".join(n for n, _ in nodes),
            "{nnodes}": str(len(nodes)), "{np}": str(sum(k for _, k in nodes))}


def place(command, nodes):
    """``command`` with the placeholders filled in for ``nodes`` [(name, slots)]."""
    values = placeholders(nodes)
    placed = []
    for word in command:
        for key, value in values.items():
            word = word.replace(key, value)
        placed.append(word)
    return placed


class Beat(collections.namedtuple("Beat", "first latest first_time latest_time pid state host")):
    """A rank's heartbeat (gpucloud.elastic.JobControl's file: one line, times in seconds since
    the epoch, state r while it runs, x once its JobControl closed, e once closed by an error)."""


def read_heartbeats(directory):
    """{rank: Beat} of the ranks that have beaten in ``directory``."""
    beats = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return beats
    for name in names:
        if not name.startswith("rank-"):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                first, latest, first_time, latest_time, pid, state, host = f.read().split()[:7]
            beats[int(name[5:])] = Beat(int(first), int(latest), float(first_time), float(latest_time), int(pid),
                                         state, host)
        except (OSError, ValueError):
            continue  # not written yet, or caught mid-write: the next read sees it
    return beats


class _Metrics:
    """The supervisor's counters, as Prometheus text (served on --metrics-port) and as JSON."""

    def __init__(self, labels):
        self.lock = threading.Lock()
        self.labels = labels
        self.restarts = collections.Counter()  # by kind: failure, hang
        self.preemptions = 0
        self.steps_lost = 0
        self.recovery_seconds = []
        self.attempt = 0
        self.running = 0
        self.nodes = None  # with --nodes: the launch's nodes and ranks
        self.world_size = None

    def text(self):
        base = ",".join(f'{k}="{v}"' for k, v in sorted(self.labels.items()))
        with self.lock:
            lines = [
                "# HELP gpucloud_run_restarts_total Restarts of the job by gpucloud-run, by why the launch ended.",
                "# TYPE gpucloud_run_restarts_total counter",
            ]
            for kind in ("failure", "hang"):
                lines.append(f'gpucloud_run_restarts_total{{{base},kind="{kind}"}} {self.restarts[kind]}')
            lines += [
                "# HELP gpucloud_run_preemptions_total Preemptions passed on to the job (it saved and exited 75).",
                "# TYPE gpucloud_run_preemptions_total counter",
                f"gpucloud_run_preemptions_total{{{base}}} {self.preemptions}",
                "# HELP gpucloud_run_steps_lost_total Steps run again after restarts (since their checkpoints).",
                "# TYPE gpucloud_run_steps_lost_total counter",
                f"gpucloud_run_steps_lost_total{{{base}}} {self.steps_lost}",
                "# HELP gpucloud_run_recovery_seconds Detection of the last failure to the restarted job's first step.",
                "# TYPE gpucloud_run_recovery_seconds gauge",
                f"gpucloud_run_recovery_seconds{{{base}}} {self.recovery_seconds[-1] if self.recovery_seconds else 0}",
                "# HELP gpucloud_run_attempt The launch running now (0: the first).",
                "# TYPE gpucloud_run_attempt gauge",
                f"gpucloud_run_attempt{{{base}}} {self.attempt}",
                "# HELP gpucloud_run_job_running 1 while the job's command runs.",
                "# TYPE gpucloud_run_job_running gauge",
                f"gpucloud_run_job_running{{{base}}} {self.running}",
            ]
            if self.nodes is not None:
                lines += [
                    "# HELP gpucloud_run_nodes The nodes the launch runs on (--nodes that passed --node-check).",
                    "# TYPE gpucloud_run_nodes gauge",
                    f"gpucloud_run_nodes{{{base}}} {self.nodes}",
                    "# HELP gpucloud_run_world_size The launch's ranks ({np}).",
                    "# TYPE gpucloud_run_world_size gauge",
                    f"gpucloud_run_world_size{{{base}}} {self.world_size}",
                ]
        return "\n".join(lines) + "\n"

    def serve(self, port):
        import http.server

        metrics = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = metrics.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("", port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="gpucloud-run metrics", daemon=True).start()
        return server


class Supervisor:
    """Runs ``command`` until it succeeds, is preempted, or fails more than ``max_restarts`` times."""

    def __init__(self, command, args):
        self.command = command
        self.args = args
        self.run_dir = os.path.abspath(args.run_dir or f"gpucloud-run.{os.getpid()}")
        os.makedirs(self.run_dir, exist_ok=True)
        self.preempt_signal = None  # the signal the supervisor got, once it has
        self.interrupted = False
        self.metrics = _Metrics({"job": args.job_name})
        self.history = []  # one dict per launch
        self.pool = NodePool(args) if args.nodes else None

    def stop_signal(self):
        if self.args.stop_signal:
            return self.args.stop_signal
        program = os.path.basename(self.command[0])
        if program == "torchrun" or "torch.distributed.run" in self.command:
            return signal.SIGTERM  # torchrun passes SIGTERM on to its workers (SIGUSR1 would end it)
        return signal.SIGUSR1

    def _on_signal(self, signo, _frame):
        if signo == signal.SIGINT:
            self.interrupted = True
        elif self.preempt_signal is None:
            self.preempt_signal = signo

    def _pump(self, stream, tail):
        for line in iter(stream.readline, b""):
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()
            tail.append(line.decode(errors="replace").rstrip("\n"))

    def _teardown(self, proc, session, failed):
        """Ends every process of the launch's session. After a failure the ranks are killed at
        once (a peer is gone: they cannot save, and one that catches SIGTERM would wait for it),
        the launcher gets SIGTERM to clean up after itself; otherwise all get SIGTERM (and SIGCONT,
        for a stopped one). SIGKILL to what is left after --grace seconds."""
        if failed:
            # The launcher sees its ranks die and ends by itself, faster than after a SIGTERM
            # (mpirun then waits a second; a SIGTERM during its own abort can crash it).
            _signal_all([p for p in _session_processes(session) if p != proc.pid], signal.SIGKILL)
            end = time.monotonic() + min(self.args.grace, 3.0)
            while proc.poll() is None and time.monotonic() < end:
                time.sleep(0.005)
        pids = _session_processes(session)
        _signal_all(pids, signal.SIGTERM)
        _signal_all(pids, signal.SIGCONT)
        deadline = time.monotonic() + self.args.grace
        while time.monotonic() < deadline:
            proc.poll()
            if not _session_processes(session):
                break
            time.sleep(0.01)
        left = _session_processes(session)
        _signal_all(left, signal.SIGKILL)
        while _session_processes(session) and time.monotonic() < deadline + 10:
            proc.poll()
            time.sleep(0.01)
        if proc.poll() is None:
            proc.wait()

    def _launch(self, attempt, reason, nodes):
        attempt_dir = os.path.join(self.run_dir, f"attempt-{attempt}")
        os.makedirs(attempt_dir, exist_ok=True)
        env = dict(os.environ, GPUCLOUD_RESTART_COUNT=str(attempt), GPUCLOUD_RESTART_REASON=reason,
                   GPUCLOUD_RUN_DIR=attempt_dir)
        command = self.command
        if nodes is not None:
            command = place(self.command, nodes)
            values = placeholders(nodes)
            env.update(GPUCLOUD_RUN_HOSTS=values["{hosts}"], GPUCLOUD_RUN_NP=values["{np}"])
        # mpirun ending a job (a rank died) sends SIGTERM, then SIGKILL this many seconds later
        # (default 1): ranks that catch SIGTERM (JobControl) would hold the restart up for it.
        env.setdefault("OMPI_MCA_odls_base_sigkill_timeout", "0")
        tail = collections.deque(maxlen=self.args.error_lines)
        proc = subprocess.Popen(command, env=env, start_new_session=True, stderr=subprocess.PIPE)
        pump = threading.Thread(target=self._pump, args=(proc.stderr, tail), daemon=True)
        pump.start()
        return proc, pump, tail, attempt_dir

    def _watch(self, proc, attempt_dir):
        """Waits for the launch to end; passes a preemption on; sees a rank of this node die (its
        process gone while its heartbeat says it runs) without waiting for the launcher to notice;
        ends a hung one, and a launcher still running a few seconds after a rank failed (mpirun
        waits for a node whose link is cut). Returns (status, (why, rank, step) or None,
        preemption passed on)."""
        passed_on = False
        node = os.uname().nodename
        failed_since = None  # since when a rank's heartbeat says it failed
        while True:
            code = proc.poll()
            if code is not None:
                return code, None, passed_on
            if (self.preempt_signal is not None or self.interrupted) and not passed_on:
                signo = signal.SIGINT if self.interrupted and self.preempt_signal is None else self.stop_signal()
                _say(f"passing {signal.Signals(signo).name} on to the job" +
                     (": its ranks save at their current step" if signo != signal.SIGINT else ""))
                try:
                    os.kill(proc.pid, signo)
                except ProcessLookupError:
                    pass
                passed_on = True
            now = time.time()
            beats = read_heartbeats(attempt_dir)
            failed = [rank for rank, b in sorted(beats.items()) if b.state == "e"]
            if failed:  # a rank ended with an error: the launcher has a few seconds to end by itself
                failed_since = failed_since or time.monotonic()
                if time.monotonic() - failed_since > min(self.args.grace, 5.0):
                    return None, (f"rank {failed[0]} failed and the launcher did not exit", failed[0],
                                  beats[failed[0]].latest), passed_on
            for rank, beat in sorted(beats.items()):
                if beat.state == "r" and beat.host == node and not _alive(beat.pid):
                    if proc.poll() is not None:  # the launcher ended too: its status says more
                        return proc.returncode, None, passed_on
                    return None, (f"rank {rank} died (pid {beat.pid} gone)", rank, beat.latest), passed_on
                if (self.args.hang_timeout > 0 and not passed_on and beat.state == "r"
                        and now - beat.latest_time > self.args.hang_timeout):
                    quiet = now - beat.latest_time
                    return None, (f"rank {rank} hung (no step for {quiet:.0f} s)", rank, beat.latest), passed_on
            time.sleep(0.02)

    def run(self):
        for signo in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(signo, self._on_signal)
        if self.args.metrics_port >= 0:
            server = self.metrics.serve(self.args.metrics_port)
            _say(f"metrics at http://{os.uname().nodename}:{server.server_address[1]}/metrics")
        attempt, reason, failures, stalled = 0, "", [], 0
        detected = None  # when the previous launch's failure was seen
        while True:
            with self.metrics.lock:
                self.metrics.attempt, self.metrics.running = attempt, 1
            began, launched_at = time.monotonic(), time.time()
            nodes, left_out = None, {}
            if self.pool is not None:
                try:
                    nodes, left_out = self.pool.choose(lambda: self.preempt_signal is not None or self.interrupted)
                except _NotEnoughNodes as e:
                    return self._no_nodes(attempt, str(e))
                ranks = sum(k for _, k in nodes)
                with self.metrics.lock:
                    self.metrics.nodes, self.metrics.world_size = len(nodes), ranks
            proc, pump, tail, attempt_dir = self._launch(attempt, reason, nodes)
            where = ""
            if nodes is not None:
                where = (f" on {len(nodes)} node(s), {ranks} rank(s): " +
                         ",".join(n for n, _ in nodes) +
                         "".join(f"; {n} left out ({w})" for n, w in left_out.items()))
            _say(f"launch {attempt} (pid {proc.pid}){where}" + (f" after: {reason}" if reason else ""))
            code, hung, passed_on = self._watch(proc, attempt_dir)
            if hung is not None:
                why, rank, step = hung
                reason = f"{why} after step {step}"
                _say(f"{reason}: stopping the job")
            seen = time.time()  # the heartbeats' clock
            self._teardown(proc, proc.pid, failed=hung is not None or (code not in (0, PREEMPTED_EXIT_CODE)
                                                                        and not passed_on))
            torn_down = time.time()
            pump.join(timeout=5)
            code = proc.returncode if hung is None else code
            beats = read_heartbeats(attempt_dir)
            # Times are seconds since the epoch (the heartbeats' clock): launched, first step
            # beaten, end seen, every process of the launch gone.
            record = {"attempt": attempt, "status": code, "seconds": round(time.monotonic() - began, 3),
                      "first_step": min((b.first for b in beats.values() if b.first >= 0), default=None),
                      "last_step": max((b.latest for b in beats.values()), default=None),
                      "launched_at": round(launched_at, 3),
                      "first_step_at": max((round(b.first_time, 3) for b in beats.values() if b.first >= 0),
                                           default=None),
                      "ended_at": round(seen, 3), "torn_down_at": round(torn_down, 3)}
            if nodes is not None:
                record.update(nodes=[n for n, _ in nodes], np=ranks, left_out=left_out)
            if detected is not None and failures:
                if record["first_step_at"] is not None:  # every rank has run its first step
                    recovery = record["first_step_at"] - detected[1]
                    record["recovery_seconds"] = round(recovery, 3)
                    with self.metrics.lock:
                        self.metrics.recovery_seconds.append(recovery)
                previous_last = self.history[-1]["last_step"]
                if previous_last is not None and record["first_step"] is not None:
                    # A launch's first beat is after its first step: it resumed at first_step - 1.
                    lost = max(0, previous_last - (record["first_step"] - 1))
                    record["steps_lost"] = lost
                    with self.metrics.lock:
                        self.metrics.steps_lost += lost
            with self.metrics.lock:
                self.metrics.running = 0
            unfinished = self.args.require_heartbeat and code == 0 and hung is None and (
                not beats or any(b.state != "x" for b in beats.values()))
            if unfinished:  # exit 0, yet a rank never beat or never closed: it did not run to its end
                hung = ("the launch ended with status 0 but " +
                        ("no rank's heartbeat" if not beats else "a rank's heartbeat not closed") +
                        " (--require-heartbeat)", -1, record["last_step"])
                reason = hung[0]
            if hung is None:
                if code == 0:
                    record["end"] = "finished"
                elif self.interrupted and self.preempt_signal is None:
                    record["end"] = "interrupted"
                elif code == PREEMPTED_EXIT_CODE or passed_on:
                    record["end"] = "preempted"
                else:
                    reason = _describe_status(code)
                    why = _error_line(tail)
                    if why:
                        reason += ": " + why
                    record["end"] = "failed"
            else:
                record["end"] = "hung" if " hung " in hung[0] else "failed"
            record["reason"] = reason if record["end"] in ("failed", "hung") else ""
            self.history.append(record)
            self._write_status()
            if record["end"] == "finished":
                _say(self._summary("finished"))
                return 0
            if record["end"] == "preempted" or self.preempt_signal is not None:
                with self.metrics.lock:
                    self.metrics.preemptions += 1
                _say(self._summary(f"preempted: exit {PREEMPTED_EXIT_CODE} (requeue the job; it resumes where it stopped)"))
                self._write_status()
                return PREEMPTED_EXIT_CODE
            if self.interrupted:
                _say(self._summary("interrupted"))
                return 130
            failures.append((reason, list(tail)))
            if len(failures) > self.args.max_restarts:
                first_reason, first_tail = failures[0]
                _say(self._summary(f"giving up after {self.args.max_restarts} restart(s)"))
                _say(f"the first failure: {first_reason}; its last lines:")
                for line in first_tail[-20:]:
                    print(f"  | {line}", file=sys.stderr)
                sys.stderr.flush()
                return code if code and code > 0 else 1
            with self.metrics.lock:
                self.metrics.restarts["hang" if record["end"] == "hung" else "failure"] += 1
            detected = (attempt, seen)
            # The backoff doubles while launches fail without a step of progress (a crash loop),
            # and starts over after one that trained.
            progressed = record["first_step"] is not None and record["last_step"] > record["first_step"]
            stalled = 0 if progressed else stalled + 1
            delay = min(self.args.backoff * (2 ** max(stalled - 1, 0)), self.args.backoff_max)
            _say(f"launch {attempt} ended ({reason}); restart {attempt + 1} of at most {self.args.max_restarts} "
                 f"in {delay:.1f} s")
            end = time.monotonic() + delay
            while time.monotonic() < end and self.preempt_signal is None and not self.interrupted:
                time.sleep(0.05)
            if self.preempt_signal is not None or self.interrupted:
                _say(self._summary("stopped before the restart"))
                return PREEMPTED_EXIT_CODE if self.preempt_signal is not None else 130
            attempt += 1

    def _no_nodes(self, attempt, why):
        """Ends the run when too few nodes answer: 75 or 130 when it was stopping anyway, else 1."""
        self.history.append({"attempt": attempt, "status": None, "end": "no nodes", "reason": why,
                             "ended_at": round(time.time(), 3)})
        self._write_status()
        if self.preempt_signal is not None:
            _say(self._summary(f"preempted while waiting for nodes: exit {PREEMPTED_EXIT_CODE}"))
            return PREEMPTED_EXIT_CODE
        if self.interrupted:
            _say(self._summary("interrupted while waiting for nodes"))
            return 130
        _say(self._summary(f"giving up: {why}"))
        return 1

    def _summary(self, outcome):
        restarts = len([r for r in self.history if r["end"] != "no nodes"]) - 1
        lost = sum(r.get("steps_lost", 0) for r in self.history)
        recovery = [r["recovery_seconds"] for r in self.history if "recovery_seconds" in r]
        text = f"{outcome}: {restarts} restart(s), {lost} step(s) lost"
        if recovery:
            text += f", recovery {sum(recovery) / len(recovery):.2f} s mean, {max(recovery):.2f} s max"
        reasons = collections.Counter(r["reason"] for r in self.history if r["reason"] and r["end"] != "no nodes")
        if reasons:
            text += "; " + "; ".join(f"{n}x {why}" for why, n in reasons.most_common(3))
        return text

    def _write_status(self):
        path = os.path.join(self.run_dir, "status.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"command": self.command, "launches": self.history}, f, indent=1)
        os.replace(path + ".tmp", path)


def _signal_name(text):
    try:
        return signal.Signals[text if text.startswith("SIG") else "SIG" + text]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a signal name (TERM, USR1, ...)") from None


def _non_negative(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < 0 or value != value:
            raise argparse.ArgumentTypeError(f"{value} must be at least 0")
        return value
    return parse


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="gpucloud-run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-restarts", type=_non_negative(int), default=3, help="restarts after failures (default 3)")
    ap.add_argument("--backoff", type=_non_negative(float), default=1.0,
                    help="seconds before a restart (default 1), doubled for each launch in a row that failed "
                         "before its first step")
    ap.add_argument("--backoff-max", type=_non_negative(float), default=60.0, help="the longest wait (default 60)")
    ap.add_argument("--hang-timeout", type=_non_negative(float), default=0.0,
                    help="a rank whose heartbeat stops this many seconds is hung: restart (0: off, the default; "
                         "the ranks' own GPUCLOUD_COMM_TIMEOUT still ends a hang)")
    ap.add_argument("--grace", type=_non_negative(float), default=10.0,
                    help="seconds the job's processes get after SIGTERM before SIGKILL, at a teardown (default 10)")
    ap.add_argument("--stop-signal", type=_signal_name, default=None,
                    help="the signal a preemption is passed on as (default: TERM for torchrun, USR1 otherwise)")
    ap.add_argument("--require-heartbeat", action="store_true",
                    help="the job's ranks use gpucloud.elastic.JobControl: a launch that ends with status 0 without "
                         "every rank's heartbeat closed (a launch that failed, a rank that never started) is a failure")
    ap.add_argument("--nodes", help="elastic world size: the nodes to run on, NAME[:SLOTS],... or @FILE (read again "
                    "before every launch); the command places its ranks with {hosts}, {nodes}, {nnodes}, {np}")
    ap.add_argument("--nproc-per-node", type=int, default=1, help="slots of a node that does not say (default 1)")
    ap.add_argument("--min-nodes", type=int, default=None,
                    help="launch on no fewer nodes (default: all of --nodes: a node lost ends the job)")
    ap.add_argument("--max-nodes", type=int, default=None, help="launch on no more nodes (default: all)")
    ap.add_argument("--node-check", help="shell command that exits 0 when node {node} can run ranks, run for "
                    "every node before each launch (e.g. ssh -o BatchMode=yes {node} true); default: none")
    ap.add_argument("--node-check-timeout", type=_non_negative(float), default=10.0,
                    help="seconds a --node-check gets (default 10)")
    ap.add_argument("--node-wait", type=_non_negative(float), default=60.0,
                    help="seconds to wait for --min-nodes nodes to pass the check before giving up (default 60)")
    ap.add_argument("--run-dir", help="heartbeats and status.json (default ./gpucloud-run.PID)")
    ap.add_argument("--metrics-port", type=int, default=-1, help="serve Prometheus metrics (0: a free port)")
    ap.add_argument("--job-name", default=os.environ.get("SLURM_JOB_NAME", "gpucloud"),
                    help="the job label of the metrics")
    ap.add_argument("--error-lines", type=int, default=200, help="lines of the job's stderr kept per launch")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the job's command")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("the job's command is missing (gpucloud-run [options] -- COMMAND ...)")
    if not -1 <= args.metrics_port <= 65535:
        ap.error(f"--metrics-port: {args.metrics_port} is not a port (0: a free one, -1: none)")
    placeholders = sorted({p for p in PLACEHOLDERS for word in command if p in word})
    if args.nodes is None:
        for name in ("min_nodes", "max_nodes", "node_check"):
            if getattr(args, name) is not None:
                ap.error(f"--{name.replace('_', '-')} needs --nodes")
        if placeholders:
            ap.error(f"the command uses {', '.join(placeholders)}, which only --nodes fills in")
    else:
        if args.nproc_per_node < 1:
            ap.error(f"--nproc-per-node: {args.nproc_per_node} must be at least 1")
        try:
            listed = len(parse_nodes(args.nodes, args.nproc_per_node))
        except (OSError, ValueError) as e:
            ap.error(f"--nodes: {e}")
        if args.min_nodes is None:
            args.min_nodes = listed
        if args.max_nodes is None:
            args.max_nodes = 0  # all
        if args.min_nodes < 1:
            ap.error(f"--min-nodes: {args.min_nodes} must be at least 1")
        if args.max_nodes and args.max_nodes < args.min_nodes:
            ap.error(f"--max-nodes: {args.max_nodes} is below --min-nodes {args.min_nodes}")
        if not {"{hosts}", "{nodes}"} & set(placeholders):
            ap.error("--nodes: the command must place its ranks with {hosts} or {nodes} (and {np})")
    return Supervisor(command, args).run()


if __name__ == "__main__":
    sys.exit(main())
