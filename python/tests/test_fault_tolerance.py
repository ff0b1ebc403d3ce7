"""Surviving the cloud from Python: gpucloud.elastic (JobControl, State) and gpucloud-run, with
real processes and real faults: the Python example killed (SIGKILL) 20 times on 2 and on 4 ranks,
preempted (SIGTERM/SIGUSR1) with 0 steps lost, a stopped rank (SIGSTOP); each job must end with
the uninterrupted run's weights, bit for bit. The same supervisor against a job that fails the same
way every time stops after --max-restarts, with the original error shown."""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import gpucloud as gc

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_mlp.py"
TRIALS = ROOT / "tests" / "elastic" / "fault_trials.py"
SUPERVISOR = f"{sys.executable} -m gpucloud.run"

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not installed (openmpi-bin)")


def run_python(code, env=None, timeout=120, cwd=None):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})), cwd=cwd)


def skip_where_the_trials_run_elsewhere():
    if os.environ.get("GPUCLOUD_FAULT_TRIALS") == "0":
        pytest.skip("GPUCLOUD_FAULT_TRIALS=0: scripts/test.sh runs the fault trials in another configuration")


def fault_trials(tmp_path, mode, np_, trials, per_job=5):
    skip_where_the_trials_run_elsewhere()
    r = subprocess.run([sys.executable, str(TRIALS), mode, "--work", str(tmp_path / "work"), "--np", str(np_),
                        "--trials", str(trials), "--per-job", str(per_job), "--steps", "2000",
                        "--supervisor", SUPERVISOR, "--", sys.executable, str(EXAMPLE)],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0 and "FAULT TRIALS PASSED" in r.stdout, r.stdout[-8000:] + r.stderr[-8000:]
    print(r.stdout.splitlines()[-2])


@needs_mpirun
@pytest.mark.parametrize("ranks", [2, 4])
def test_python_example_killed_20_times_ends_with_the_uninterrupted_weights(tmp_path, ranks):
    fault_trials(tmp_path, "kill", ranks, 20, per_job=10)


@needs_mpirun
@pytest.mark.parametrize("ranks", [2, 4])
def test_python_example_preempted_loses_no_step(tmp_path, ranks):
    fault_trials(tmp_path, "preempt", ranks, 6 if ranks == 2 else 3, per_job=3)


@needs_mpirun
def test_python_example_with_a_stopped_rank_restarts(tmp_path):
    fault_trials(tmp_path, "hang", 2, 1, per_job=1)


def _namespaces_as_nodes():
    """Why network namespaces cannot stand in for nodes here, or '' when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ping") is None or shutil.which("mpirun") is None:
        return "ping (iputils-ping) or mpirun (openmpi-bin) is not installed"
    r = subprocess.run([str(ROOT / "scripts" / "netns-nodes.sh"), "check"], capture_output=True, text=True,
                       env=dict(os.environ, GPUCLOUD_NETNS_PREFIX="gcelcheck"))
    return "" if r.returncode == 0 else r.stdout.strip()


@pytest.mark.skipif(bool(_namespaces_as_nodes()), reason=_namespaces_as_nodes() or "-")
def test_python_example_restarts_on_the_node_that_remains(tmp_path):
    skip_where_the_trials_run_elsewhere()
    # Node 2 of 2 (network namespaces) killed and removed mid-run: gpucloud-run --nodes --min-nodes 1
    # restarts the job on node 1 (4 ranks -> 2), resharding the checkpoint; the final weights equal an
    # uninterrupted 2-rank run's from the checkpoint the restart loaded.
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "elastic" / "node_faults.py"), "kill", "--work",
                        str(tmp_path / "work"), "--steps", "3000", "--", sys.executable, str(EXAMPLE)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "NODE FAULT TEST PASSED" in r.stdout, r.stdout[-6000:] + r.stderr[-6000:]
    print(r.stdout.splitlines()[0])


def test_a_job_that_fails_the_same_way_stops_after_max_restarts(tmp_path):
    job = [sys.executable, "-c", "import sys; print('ValueError: bad row 7 in shard-3', file=sys.stderr); sys.exit(3)"]
    r = subprocess.run([sys.executable, "-m", "gpucloud.run", "--max-restarts", "2", "--backoff", "0.05",
                        "--run-dir", str(tmp_path / "run"), "--", *job], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert r.stderr.count("bad row 7") >= 4, r.stderr  # each launch's, and the first one's again at the end
    assert "giving up after 2 restart(s)" in r.stderr
    assert "the first failure: exit status 3: ValueError: bad row 7 in shard-3" in r.stderr
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert [launch["end"] for launch in status["launches"]] == ["failed"] * 3
    assert [launch["attempt"] for launch in status["launches"]] == [0, 1, 2]


def test_the_failure_reason_is_an_error_never_a_warning():
    from gpucloud.run import _error_line

    warning = "gpucloud: warning: OpenBLAS runs its Prescott kernels on this AVX-512 CPU"
    assert _error_line([warning, "Traceback (most recent call last):", "RuntimeError: disk 1 is flaky"]) == \
        "RuntimeError: disk 1 is flaky"
    assert _error_line(["ValueError: x", "gpucloud: rank 1 timed out in all_reduce", warning]) == \
        "gpucloud: rank 1 timed out in all_reduce"
    assert _error_line([warning]) == ""


def test_each_launch_is_told_its_restart_count_and_why(tmp_path):
    # The job fails twice, then reads what gpucloud-run told it through gpucloud.elastic.
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import gpucloud as gc
        with gc.elastic.JobControl() as control:
            info = control.restart
            print(f"restart {{info.count}}: {{info.reason}}")
            if info.count < 2:
                print("RuntimeError: disk {{}} is flaky".format(info.count), file=sys.stderr)
                sys.exit(1)
        print("done", info.count, info.reason)
    """))
    r = subprocess.run([sys.executable, "-m", "gpucloud.run", "--backoff", "0", "--run-dir", str(tmp_path / "run"),
                        "--", sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "done 2 exit status 1: RuntimeError: disk 1 is flaky" in r.stdout, r.stdout + r.stderr
    assert "restart 0: \n" in r.stdout


def test_the_supervisor_serves_its_metrics(tmp_path):
    # A job that fails once then succeeds slowly enough to be scraped mid-run.
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        if os.environ["GPUCLOUD_RESTART_COUNT"] == "0":
            sys.exit(4)
        time.sleep(30)
    """))
    p = subprocess.Popen([sys.executable, "-m", "gpucloud.run", "--backoff", "0", "--metrics-port", "0",
                          "--job-name", "probe", "--run-dir", str(tmp_path / "run"), "--", sys.executable, str(script)],
                         stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in p.stderr:
            if "metrics at " in line:
                url = "http://127.0.0.1:" + line.rsplit(":", 1)[1].split("/")[0] + "/metrics"
            if "launch 1" in line:
                break
        assert url, "no metrics address printed"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        assert 'gpucloud_run_restarts_total{job="probe",kind="failure"} 1' in text, text
        assert 'gpucloud_run_attempt{job="probe"} 1' in text, text
        assert 'gpucloud_run_job_running{job="probe"} 1' in text, text
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=10)
    finally:
        p.send_signal(signal.SIGINT)  # stops the job, no restart
        p.communicate(timeout=60)
    assert p.returncode == 130


@pytest.mark.parametrize("options, named", [
    (["--max-restarts", "-1"], "--max-restarts"),
    (["--backoff", "nan"], "--backoff"),
    (["--stop-signal", "NOPE"], "--stop-signal"),
    (["--metrics-port", "70000"], "--metrics-port"),
    ([], "command is missing"),
])
def test_the_supervisor_refuses_bad_options_by_name(options, named):
    r = subprocess.run([sys.executable, "-m", "gpucloud.run", *options, *(["--", "true"] if options else [])],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and named in r.stderr, r.stderr


@pytest.mark.parametrize("argv, named", [
    (["--min-nodes", "1", "--", "true"], "--min-nodes needs --nodes"),
    (["--", "echo", "{np}"], "only --nodes fills in"),
    (["--nodes", "a,b", "--", "echo", "{np}"], "must place its ranks with {hosts} or {nodes}"),
    (["--nodes", "a:0", "--", "echo", "{hosts}"], "'a:0' is not NAME"),
    (["--nodes", "a,a", "--", "echo", "{hosts}"], "'a' is listed twice"),
    (["--nodes", "a,b", "--min-nodes", "2", "--max-nodes", "1", "--", "echo", "{hosts}"], "--max-nodes"),
    (["--nodes", "a", "--min-nodes", "0", "--", "echo", "{hosts}"], "--min-nodes"),
    (["--nodes", "@/nonexistent/nodes", "--", "echo", "{hosts}"], "--nodes"),
])
def test_the_supervisor_refuses_bad_node_options_by_name(argv, named):
    r = subprocess.run([sys.executable, "-m", "gpucloud.run", *argv], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and named in r.stderr, r.stderr


def test_the_world_follows_the_nodes_that_answer(tmp_path):
    # Nodes a (2 slots), b, c; at most 2 launched on; a node "answers" while its file exists.
    # The job stands in for a node loss and return: launch 0 takes b away, launch 1 brings it back.
    up = tmp_path / "up"
    up.mkdir()
    for node in "abc":
        (up / node).touch()
    nodes = tmp_path / "nodes"
    nodes.write_text("a slots=2\nb  # a comment\nc:1\n")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        attempt = int(os.environ["GPUCLOUD_RESTART_COUNT"])
        print("launch", attempt, sys.argv[1:], os.environ["GPUCLOUD_RUN_HOSTS"], os.environ["GPUCLOUD_RUN_NP"])
        if attempt == 0:
            os.remove("{up}/b")
            sys.exit(1)
        if attempt == 1:
            open("{up}/b", "w").close()
            sys.exit(1)
    """))
    r = subprocess.run([sys.executable, "-m", "gpucloud.run", "--backoff", "0", "--nodes", f"@{nodes}",
                        "--min-nodes", "1", "--max-nodes", "2", "--node-check", f"test -e {up}/{{node}}",
                        "--run-dir", str(tmp_path / "run"), "--", sys.executable, str(script), "{hosts}", "{nodes}",
                        "{nnodes}", "np={np}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "launch 0 ['a:2,b:1', 'a,b', '2', 'np=3'] a:2,b:1 3",
        "launch 1 ['a:2,c:1', 'a,c', '2', 'np=3'] a:2,c:1 3",
        "launch 2 ['a:2,b:1', 'a,b', '2', 'np=3'] a:2,b:1 3",
    ], r.stdout
    assert "launch 1 (pid" in r.stderr and "on 2 node(s), 3 rank(s): a,c; b left out (--node-check: exit status 1)" \
        in r.stderr, r.stderr
    launches = json.loads((tmp_path / "run" / "status.json").read_text())["launches"]
    assert [launch["nodes"] for launch in launches] == [["a", "b"], ["a", "c"], ["a", "b"]]
    assert launches[1]["left_out"] == {"b": "--node-check: exit status 1"}


def test_too_few_nodes_ends_the_run_with_the_reasons(tmp_path):
    # b's check never answers: after --node-wait the run gives up, saying why for each node.
    r = subprocess.run([sys.executable, "-m", "gpucloud.run", "--nodes", "a,b", "--node-check",
                        "[ {node} = a ] || sleep 60", "--node-check-timeout", "0.5", "--node-wait", "1",
                        "--run-dir", str(tmp_path / "run"), "--", "echo", "{hosts}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "waiting up to 1 s for 2 node(s)" in r.stderr, r.stderr
    assert "giving up: 1 node(s) pass --node-check, --min-nodes is 2; b: --node-check did not answer in 0.5 s" \
        in r.stderr, r.stderr
    launches = json.loads((tmp_path / "run" / "status.json").read_text())["launches"]
    assert [launch["end"] for launch in launches] == ["no nodes"]


def test_a_failed_rank_ends_a_launcher_that_does_not_exit(tmp_path):
    # The rank raises (its heartbeat says failed: e); its launcher stays (mpirun waiting for a node
    # that is cut off): the supervisor ends the launch within seconds instead of never.
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import gpucloud as gc
        control = gc.elastic.JobControl()
        control.should_stop(1)
        raise RuntimeError("a peer is gone")
    """))
    launcher = f"{sys.executable} {script}; sleep 600"
    r = subprocess.run([sys.executable, "-m", "gpucloud.run", "--max-restarts", "0", "--grace", "2",
                        "--run-dir", str(tmp_path / "run"), "--", "sh", "-c", launcher],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "rank 0 failed and the launcher did not exit after step 1" in r.stderr, r.stderr
    assert "RuntimeError: a peer is gone" in r.stderr
    # In a trainer that catches its error: __exit__ with an exception, or mark_failed().
    run_dir = tmp_path / "beats"
    run_dir.mkdir()
    r = run_python("""
        import gpucloud as gc
        from gpucloud.run import read_heartbeats
        def state():
            beat = read_heartbeats(".")[0]
            return f"{beat.latest}{beat.state}"
        with gc.elastic.JobControl() as control:
            control.should_stop(2)
        print(state())
        try:
            with gc.elastic.JobControl() as control:
                control.should_stop(3)
                raise ValueError("bad batch")
        except ValueError:
            print(state())
        with gc.elastic.JobControl() as control:
            control.should_stop(4)
            control.mark_failed()
            print(state())
        print(state())
    """, env={"GPUCLOUD_RUN_DIR": str(run_dir)}, cwd=run_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2x", "3e", "4r", "4e"], r.stdout


def test_job_control_turns_a_signal_into_a_stop_request():
    r = run_python("""
        import os, signal
        import gpucloud as gc
        control = gc.elastic.JobControl()
        assert not control.should_stop(0)
        os.kill(os.getpid(), signal.SIGTERM)          # the default action would end the process
        assert control.stop_requested and control.stop_signal == signal.SIGTERM
        assert control.should_stop(1) and control.first_step == 0
        try:
            gc.elastic.JobControl()
        except gc.InvalidArgument as e:
            assert "another JobControl lives" in str(e), e
        else:
            raise AssertionError("a second JobControl was allowed")
        control.close()
        try:
            control.should_stop(2)
        except gc.InvalidArgument as e:
            assert "closed" in str(e)
        again = gc.elastic.JobControl(signals=[signal.SIGUSR2])
        os.kill(os.getpid(), signal.SIGUSR2)
        assert again.stop_signal == signal.SIGUSR2
        del again
        try:
            gc.elastic.JobControl(signals=[signal.SIGKILL])
        except gc.InvalidArgument as e:
            assert "cannot be caught" in str(e)
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_restart_facts_and_bad_variables():
    r = run_python("""
        import gpucloud as gc
        info = gc.elastic.restart_info_from_environment()
        print(info.count, info.reason, repr(info))
    """, env={"GPUCLOUD_RESTART_COUNT": "3", "GPUCLOUD_RESTART_REASON": "rank 2 died"})
    assert r.returncode == 0 and "3 rank 2 died RestartInfo(count=3, reason='rank 2 died')" in r.stdout, r.stderr
    r = run_python("import gpucloud as gc; gc.elastic.JobControl()", env={"GPUCLOUD_RESTART_COUNT": "x"})
    assert r.returncode != 0 and "GPUCLOUD_RESTART_COUNT='x' is not a restart count" in r.stderr, r.stderr


def test_state_saves_at_the_stop_and_restores_everything(tmp_path):
    s = gc.Stream()
    w = gc.Buffer(8, "float32")
    gc.fill(w, 1.5, s)
    g = gc.Buffer(8, "float32")
    gc.fill(g, 0.25, s)
    adam = gc.FusedAdam([(w, g)], s, lr=0.1)
    scaler = gc.LossScaler(gc.Device.host(), s)
    position = np.array([0], np.int64)
    state = gc.elastic.State(str(tmp_path / "ck"), every=4, keep_last=2)
    state.register("model", {"w": w})
    state.register("optimizer", adam)
    state.register("scaler", scaler)
    state.register("data", {"position": position})
    with pytest.raises(ValueError, match="registered already"):
        state.register("model", {})
    with pytest.raises(TypeError, match="state_dict"):
        state.register("other", 3)
    assert state.restore(s) == 0
    with gc.elastic.JobControl() as control:
        for step in range(6):
            adam.step(s)
            position[0] = step + 1
            if step == 4:
                control.request_stop()
            if state.end_step(step + 1, s, control):
                break
    assert step == 4
    state.close()
    assert sorted(os.listdir(tmp_path / "ck")) == ["step-000000000004", "step-000000000005"]
    s.synchronize()
    expected = np.array(np.asarray(w), copy=True)
    # A fresh job restores model, optimizer (step count), scaler and data position from step 5.
    w2, g2 = gc.Buffer(8, "float32"), gc.Buffer(8, "float32")
    adam2 = gc.FusedAdam([(w2, g2)], s, lr=0.1)
    scaler2 = gc.LossScaler(gc.Device.host(), s)
    position2 = np.array([0], np.int64)
    again = gc.elastic.State(str(tmp_path / "ck"), every=4)
    again.register("model", {"w": w2})
    again.register("optimizer", adam2)
    again.register("scaler", scaler2)
    again.register("data", {"position": position2})
    assert again.restore(s) == 5
    s.synchronize()
    assert adam2.step_count(s) == 5 and position2[0] == 5
    np.testing.assert_array_equal(np.asarray(w2), expected)
    gc.fill(w2, 0.0, s)
    position2[0] = 0
    assert again.restore(s, verify="while_copying") == 5  # checksums checked as it copies: the same state
    s.synchronize()
    assert adam2.step_count(s) == 5 and position2[0] == 5
    np.testing.assert_array_equal(np.asarray(w2), expected)
    with pytest.raises(ValueError, match="every"):
        gc.elastic.State(str(tmp_path / "x"), every=0)


@needs_mpirun
@pytest.mark.parametrize("mode", ["kill", "preempt"])
@pytest.mark.parametrize("example", ["torch_ddp.py", "torch_horovod_style.py"])
def test_torch_examples_survive_kills_and_preemptions(tmp_path, example, mode):
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, str(TRIALS), mode, "--work", str(tmp_path / "work"), "--np", "2",
                        "--trials", "6", "--per-job", "3", "--steps", "1500", "--supervisor", SUPERVISOR, "--",
                        sys.executable, str(ROOT / "examples" / example)], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0 and "FAULT TRIALS PASSED" in r.stdout, r.stdout[-8000:] + r.stderr[-8000:]


def test_require_heartbeat_takes_a_silent_success_for_a_failure(tmp_path):
    # A launch that "succeeds" without its ranks having run to their end (srun answering 0 after a
    # failed step launch): with --require-heartbeat it is restarted; a job whose ranks close their
    # heartbeat, even one with nothing left to do, is done.
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import os
        import gpucloud as gc
        if os.environ["GPUCLOUD_RESTART_COUNT"] == "0":
            raise SystemExit(0)                  # no JobControl: no heartbeat at all
        with gc.elastic.JobControl() as control:
            if os.environ["GPUCLOUD_RESTART_COUNT"] == "2":
                control.should_stop(5)           # ran a step: closed at the end
        print("launch", os.environ["GPUCLOUD_RESTART_COUNT"], "ends")
    """))
    r = subprocess.run([sys.executable, "-m", "gpucloud.run", "--require-heartbeat", "--backoff", "0",
                        "--run-dir", str(tmp_path / "run"), "--", sys.executable, str(script)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "no rank's heartbeat (--require-heartbeat)" in r.stderr, r.stderr
    # Launch 1 closed its heartbeat without a step (nothing to do): that is a finished job.
    assert "launch 1 ends" in r.stdout and "launch 2" not in r.stdout, r.stdout + r.stderr
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert [launch["end"] for launch in status["launches"]] == ["failed", "finished"]


@needs_mpirun
@pytest.mark.parametrize("order", ["control", "stream", "comm"])
def test_dropping_each_object_while_the_agreement_is_in_flight(tmp_path, order):
    # should_stop() leaves a max all-reduce on the stream; whichever object goes first (the
    # JobControl, the stream, the communicator), the process finishes cleanly on both ranks.
    script = tmp_path / "drop.py"
    script.write_text(textwrap.dedent(f"""
        import gc as pygc
        import gpucloud as gc
        comm = gc.Communicator.mpi_world()
        s = gc.Stream()
        control = gc.elastic.JobControl()
        for step in range(3):
            control.should_stop(step, comm, s)
        if "{order}" == "control":
            del control
        elif "{order}" == "stream":
            del s
        else:
            del comm
        pygc.collect()
        print("rank done", flush=True)
    """))
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
    r = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                        sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.count("rank done") == 2, r.stdout + r.stderr
