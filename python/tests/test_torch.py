"""PyTorch interop on the CPU: tensors borrowed without copying, and gpucloud's GEMM, fused
optimizers and clipping against torch's own (torch.matmul, torch.optim.SGD/AdamW,
clip_grad_norm_). Skipped where torch is not importable (CI installs Debian's python3-torch)."""
import os
import warnings

import numpy as np
import pytest

import gpucloud as gc

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")


def run_bench(script, *args, out=None):
    """Runs bench/``script`` with ``args`` (and ``--json out``); returns the process, and the JSON
    results when ``out`` is given."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / script
    r = subprocess.run([sys.executable, str(path), *map(str, args), *(["--json", str(out)] if out else [])],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r, (json.loads(out.read_text())["benchmarks"] if out else None)


def test_torch_tensors_are_borrowed_without_copying():
    s = gc.Stream()
    t = torch.arange(10, dtype=torch.float32)
    b = gc.Buffer(10, "float32")
    gc.copy(b, t, s)
    s.synchronize()
    back = torch.from_dlpack(b)
    assert back.data_ptr() == b.data_ptr
    assert torch.equal(back, t)
    out = torch.zeros(10, dtype=torch.bfloat16)
    gc.cast(out, b, s)
    s.synchronize()
    assert torch.equal(out, t.to(torch.bfloat16))


def test_tensors_of_every_float_dtype_are_written_in_place(host_stream):
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        t = torch.zeros(3, 5, dtype=dtype)
        address = t.data_ptr()
        gc.fill(t, 2.5, host_stream)
        host_stream.synchronize()
        assert t.data_ptr() == address
        assert torch.equal(t, torch.full((3, 5), 2.5, dtype=dtype)), dtype
        back = torch.from_dlpack(gc.Buffer((3, 5), "bfloat16" if dtype == torch.bfloat16 else "float32"))
        assert back.shape == (3, 5)


def test_parameters_that_require_grad_are_borrowed_through_their_detached_alias(host_stream):
    p = torch.nn.Parameter(torch.zeros(4))
    gc.fill(p, 1.0, host_stream)
    host_stream.synchronize()
    assert torch.equal(p.detach(), torch.ones(4)) and p.requires_grad


def test_bad_tensors_raise_the_documented_exceptions(host_stream):
    t = torch.zeros(4, 6)
    with pytest.raises(gc.InvalidArgument, match="non-contiguous"):
        gc.fill(t[:, ::2], 1.0, host_stream)
    with pytest.raises(gc.InvalidArgument, match="non-contiguous"):
        gc.fill(t.t(), 1.0, host_stream)
    with pytest.raises(gc.InvalidArgument):
        gc.copy(torch.zeros(5), torch.zeros(4), host_stream)
    with pytest.raises(TypeError):
        gc.fill(torch.zeros(2, dtype=torch.complex64), 1.0, host_stream)
    assert torch.equal(t, torch.zeros(4, 6))  # nothing was written


def test_every_kind_of_tensor_takes_the_right_path(host_stream):
    """Tensors are read through torch's DLPack exchange table (torch 2.15) or their attributes (1.13),
    never a DLPack export: shapes of every rank, empty ones, views at an offset, subclasses; what the attributes cannot vouch for (another layout, dtype or
    device) goes the general way and gets its error there."""
    for shape in [(), (0,), (7,), (2, 3), (2, 1, 3, 2)]:
        t = torch.zeros(shape)
        gc.fill(t, 3.0, host_stream)
        host_stream.synchronize()
        assert torch.equal(t, torch.full(shape, 3.0)), shape
    base = torch.zeros(10)
    gc.fill(base[4:7], 1.0, host_stream)  # a contiguous view at an offset: its own address
    host_stream.synchronize()
    assert base.tolist() == [0, 0, 0, 0, 1, 1, 1, 0, 0, 0]
    grid = torch.zeros(4, 6)
    gc.fill(grid[2:3, :], 1.0, host_stream)  # one row: a size-1 dimension may carry any stride
    with pytest.raises(gc.InvalidArgument, match=r"non-contiguous memory \(strides \[1, 6\]"):
        gc.fill(grid[:, 5:6].t(), 2.0, host_stream)  # one column, transposed: 1 x 4 of stride 6
    host_stream.synchronize()
    assert grid.sum(dim=1).tolist() == [0, 0, 6, 0]

    class Tagged(torch.Tensor):
        pass

    tagged = torch.zeros(3).as_subclass(Tagged)
    gc.fill(tagged, 2.0, host_stream)
    host_stream.synchronize()
    assert torch.equal(tagged.as_subclass(torch.Tensor), torch.full((3,), 2.0))
    with pytest.raises(TypeError, match="torch.int8: not supported"):
        gc.fill(torch.zeros(3, dtype=torch.int8), 1.0, host_stream)
    with pytest.raises(TypeError, match="torch.bool: not supported"):
        gc.fill(torch.zeros(3, dtype=torch.bool), 1.0, host_stream)
    if hasattr(torch, "float8_e4m3fn"):  # torch >= 2.1: fp8 tensors are borrowed as gpucloud's fp8
        for name, values in (("float8_e4m3fn", [0.5, -1.0, 448.0, 0.0]), ("float8_e5m2", [0.25, -2.0, 57344.0, 0.0])):
            f8 = torch.tensor(values).to(getattr(torch, name))
            wide = torch.zeros(4)
            gc.cast(wide, f8, host_stream)  # read in place
            gc.fill(f8[3:], 1.5, host_stream)  # written in place
            host_stream.synchronize()
            assert wide.tolist() == values and f8.float().tolist() == values[:3] + [1.5], name
    param = torch.nn.Parameter(torch.zeros(2, 2))  # torch's own getters are called directly on these
    gc.fill(param, 5.0, host_stream)
    host_stream.synchronize()
    assert torch.equal(param.detach(), torch.full((2, 2), 5.0))
    # Layouts without storage: COO and mkldnn say they are contiguous, CSR raises there; all are named.
    with pytest.raises(TypeError, match="layout torch.sparse_coo: only dense"):
        gc.fill(torch.zeros(2, 2).to_sparse(), 1.0, host_stream)
    with pytest.raises(TypeError, match="layout torch.sparse_coo: only dense"):
        gc.fill(torch.nn.Parameter(torch.zeros(2, 2).to_sparse()), 1.0, host_stream)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # CSR and nested tensors are beta/prototype in torch
        csr, nested = torch.eye(3).to_sparse_csr(), torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(TypeError, match="layout torch.sparse_csr: only dense"):
        gc.fill(csr, 1.0, host_stream)
    if torch.backends.mkldnn.is_available():
        with pytest.raises(TypeError, match="layout torch._mkldnn: only dense"):
            gc.fill(torch.zeros(2, 2).to_mkldnn(), 1.0, host_stream)
    with pytest.raises(TypeError, match="a tensor torch cannot describe as strided memory: RuntimeError"):
        gc.fill(nested, 1.0, host_stream)
    with pytest.raises(TypeError, match="device 'meta': only CPU and CUDA"):
        gc.fill(torch.empty(3, device="meta"), 1.0, host_stream)
    c = torch.zeros(4, 4)
    gc.gemm(c, torch.eye(4), torch.arange(16.0).reshape(4, 4), host_stream)
    host_stream.synchronize()
    assert torch.equal(c, torch.arange(16.0).reshape(4, 4))


def test_a_tensor_dropped_while_its_work_is_queued_lives_until_the_work_is_done(host_stream):
    import threading

    gate = threading.Event()
    gc.launch_host_func(host_stream, lambda: gate.wait(30))
    t = torch.zeros(1 << 16)
    gc.fill(t, 5.0, host_stream)
    view = torch.from_dlpack(gc.Buffer(1, "float32"))  # unrelated work between
    del t, view
    gate.set()
    host_stream.synchronize()  # the fill wrote into memory still owned: no crash, no corruption


def test_gemm_matches_torch_matmul(host_stream):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 17, 40, generator=g)
    b = torch.randn(3, 40, 9, generator=g)
    bias = torch.randn(9, generator=g)
    c = torch.full((3, 17, 9), float("nan"))
    gc.gemm(c, a, b, host_stream, epilogue="bias_relu", bias=bias)
    host_stream.synchronize()
    ref = torch.relu(a.double() @ b.double() + bias.double())
    assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-5
    ab, bb = a.bfloat16(), b.bfloat16()
    c16 = torch.zeros(3, 17, 9, dtype=torch.bfloat16)
    gc.gemm(c16, ab, bb, host_stream)
    host_stream.synchronize()
    ref16 = ab.double() @ bb.double()
    assert ((c16.double() - ref16).norm() / ref16.norm()).item() < 1e-2


def _params(seed, shapes=((30, 20), (20,), (7, 30), (7,))):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]


def _run_both(make_torch, make_gc, steps=25):
    """The same parameters and gradients through torch.optim and the gpucloud optimizer."""
    ours, theirs = _params(1), _params(1)
    for p in ours:
        p.grad = torch.zeros_like(p)
    stream = gc.Stream()
    opt_t = make_torch(theirs)
    opt_g = make_gc([(p, p.grad) for p in ours], stream)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        for p, q in zip(ours, theirs):
            grad = torch.randn(p.shape, generator=g)
            p.grad.copy_(grad)
            q.grad = grad.clone()
        opt_t.step()
        opt_g.step(stream)
        stream.synchronize()
    return ours, theirs


def _assert_close(ours, theirs, tol):
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=tol, atol=tol)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_fused_adamw_matches_torch_optim_adamw(amsgrad):
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, amsgrad=amsgrad)
    ours, theirs = _run_both(
        lambda ps: torch.optim.AdamW(ps, **kw),
        lambda ps, s: gc.FusedAdam(ps, s, decoupled_weight_decay=True, **kw),
    )
    _assert_close(ours, theirs, 1e-5)


def test_fused_adam_with_l2_weight_decay_matches_torch_optim_adam():
    kw = dict(lr=3e-3, weight_decay=0.1)
    ours, theirs = _run_both(lambda ps: torch.optim.Adam(ps, **kw), lambda ps, s: gc.FusedAdam(ps, s, **kw))
    _assert_close(ours, theirs, 1e-5)


@pytest.mark.parametrize("nesterov,dampening", [(False, 0.0), (False, 0.3), (True, 0.0)])
def test_fused_sgd_matches_torch_optim_sgd(nesterov, dampening):
    kw = dict(lr=0.05, momentum=0.9, dampening=dampening, weight_decay=1e-3, nesterov=nesterov)
    ours, theirs = _run_both(lambda ps: torch.optim.SGD(ps, **kw), lambda ps, s: gc.FusedSGD(ps, s, **kw))
    _assert_close(ours, theirs, 1e-5)


def test_clip_grad_norm_matches_torch(host_stream):
    g = torch.Generator().manual_seed(3)
    ours = [torch.randn(70000, generator=g) * 0.01, torch.randn(13, generator=g)]
    theirs = [t.clone().requires_grad_() for t in ours]
    for t, grad in zip(theirs, ours):
        t.grad = grad.clone()
    total_t = torch.nn.utils.clip_grad_norm_(theirs, max_norm=1.5)
    total_g = gc.clip_grad_norm(ours, 1.5, host_stream)
    host_stream.synchronize()
    assert np.asarray(total_g)[0] == pytest.approx(total_t.item(), rel=1e-5)
    for t, grad in zip(theirs, ours):
        torch.testing.assert_close(grad, t.grad, rtol=1e-5, atol=1e-8)


def test_training_step_comparison_runs_both_trainers_on_the_same_math(tmp_path):
    """bench/bench_train_step_torch.py: same weights, same batches, so the same loss at the end."""
    import re

    r, runs = run_bench("bench_train_step_torch.py", "--batch", 64, "--hidden", 32, "--steps", 3, "--rounds", 2,
                        out=tmp_path / "step.json")
    losses = re.search(r"gpucloud ([0-9.]+), torch ([0-9.]+)", r.stdout)
    assert losses, r.stdout
    assert float(losses.group(1)) == pytest.approx(float(losses.group(2)), rel=1e-3)
    assert [b["name"].split("/")[1] for b in runs] == ["gpucloud", "torch"]
    assert runs[0]["ratio_to_torch"] == pytest.approx(runs[0]["items_per_second"] / runs[1]["items_per_second"])


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv2d_and_its_gradients_match_torch(host_stream, layout):
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 6, 11, 9, generator=g, requires_grad=True)
    w = torch.randn(8, 3, 3, 2, generator=g, requires_grad=True)
    kw = dict(stride=(2, 1), padding=(1, 1), dilation=(2, 1), groups=2)
    y_ref = F.conv2d(x, w, **kw)
    dy = torch.randn(y_ref.shape, generator=g)
    y_ref.backward(dy)

    def to(t):  # the layout gpucloud is asked to use (a contiguous copy for NHWC)
        t = t.detach()
        return t.permute(0, 2, 3, 1).contiguous() if layout == "nhwc" else t.contiguous()

    y, dx, dw = torch.empty_like(to(y_ref)), torch.empty_like(to(x)), torch.empty_like(to(w))
    gc.conv2d_forward(y, to(x), to(w), host_stream, layout=layout, **kw)
    gc.conv2d_backward_data(dx, to(dy), to(w), host_stream, layout=layout, **kw)
    gc.conv2d_backward_filter(dw, to(x), to(dy), host_stream, layout=layout, **kw)
    host_stream.synchronize()
    torch.testing.assert_close(y, to(y_ref), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx, to(x.grad), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw, to(w.grad), rtol=1e-5, atol=1e-4)


def test_the_nccl_unique_id_travels_through_a_torch_store(tmp_path):
    """What torchrun users do: rank 0 publishes the id, every rank reads the same 128 bytes."""
    if not gc.build_info().nccl:
        pytest.skip("built without NCCL")
    import threading

    import torch.distributed as dist

    got = {}

    def rank(r):
        store = dist.FileStore(str(tmp_path / "store"), 2)
        got[r] = gc.distributed.exchange_nccl_id(store, r)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]  # the reader may come first
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got[0]) == 128 and got[0] == got[1]
    store = dist.FileStore(str(tmp_path / "store2"), 1)
    if not gc.build_info().nccl:
        return  # no NCCL in this build: Communicator.nccl raises Unsupported
    with pytest.raises(gc.InvalidArgument, match="device: NCCL communicators live on a GPU"):
        gc.distributed.nccl_from_store(store, 0, 1, gc.Device.host())
    with pytest.raises(gc.InvalidArgument, match="128"):
        gc.Communicator.nccl(b"short", 0, 1, gc.Device.host())


def _free_port():
    from ports import free_port

    return free_port()


@pytest.mark.parametrize("agent_store", [False, True])
def test_torchrun_store_exchanges_the_id_the_way_init_process_group_does(agent_store):
    """Two processes with torchrun's environment, both store hosts torchrun uses: rank 0 (c10d
    rendezvous) or the launcher (static); the real torchrun: test_launch_info_under_torchrun_with_two_agents."""
    import datetime
    import subprocess
    import sys

    import torch.distributed as dist

    if not gc.build_info().nccl:
        pytest.skip("built without NCCL")
    port = _free_port()
    agent = None
    if agent_store:  # what torchrun's agent does for static rendezvous
        agent = dist.TCPStore("127.0.0.1", port, 3, True, datetime.timedelta(seconds=60), wait_for_workers=False)
    script = (
        "import gpucloud as gc\n"
        "store, rank, size = gc.distributed.torchrun_store(60)\n"
        "print(rank, size, gc.distributed.exchange_nccl_id(store, rank).hex(), flush=True)\n"
        "store.set(f'done{rank}', b'1')\n"
        "[store.get(f'done{r}') for r in range(size)]  # rank 0's store lives until everyone has read\n"
    )
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE=str(agent_store))
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    lines = sorted(o[0].split() for o in outs)
    assert [line[:2] for line in lines] == [["0", "2"], ["1", "2"]]
    assert lines[0][2] == lines[1][2] and len(bytes.fromhex(lines[0][2])) == 128
    del agent


TORCHRUN_SCRIPT = r"""
import gpucloud as gc
l = gc.launch_info_from_environment()
store, rank, size = gc.distributed.torchrun_store(60)
store.set(f"node{rank}", str(l.node))
nodes = sorted({int(store.get(f"node{r}")) for r in range(size)})
print("INFO", l.rank, l.size, l.local_rank, l.local_size, l.node, l.nodes, l.launcher, rank, size, nodes, flush=True)
store.set(f"done{rank}", b"1")
[store.get(f"done{r}") for r in range(size)]  # the store's host lives until everyone has read
"""


def test_launch_info_under_torchrun_with_two_agents(tmp_path):
    """The real torchrun (torch.distributed.run), two agents of 2 workers each as two "nodes"
    (static rendezvous on loopback): every worker reads its rank, local rank and node from
    torchrun's variables (GROUP_RANK / GROUP_WORLD_SIZE), and the store torchrun's agent or rank 0
    hosts reaches all 4. Debian's torch 1.13 under Python 3.11 needs -r/-t as per-rank maps (its
    Std enum loses the value 0 there); the maps work on every torch."""
    import subprocess
    import sys

    script = tmp_path / "worker.py"
    script.write_text(TORCHRUN_SCRIPT)
    port = _free_port()
    agents = []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
               "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
               "-r", "0:1,1:1", "-t", "0:1,1:1", "--log_dir", str(tmp_path / f"logs{node}"), str(script)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "SLURM_"))}
        agents.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    outs = []
    for a in agents:
        try:
            outs.append(a.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            a.kill()
            outs.append(a.communicate()[0])
    assert all(a.returncode == 0 for a in agents), "\n".join(outs)
    infos = sorted(line.split("INFO ", 1)[1].split(" ", 8) for out in outs for line in out.splitlines()
                   if "INFO " in line)
    assert len(infos) == 4, "\n".join(outs)
    for info in infos:
        rank, size, local_rank, local_size, node, nodes, launcher, store_rank = map(str, info[:8])
        assert (size, local_size, nodes, launcher) == ("4", "2", "2", "torchrun"), info
        assert rank == store_rank and int(node) == int(rank) // 2 and int(local_rank) == int(rank) % 2, info
        assert info[8].strip() == "4 [0, 1]", info


def test_the_launch_docs_script_runs_under_torchrun_and_mpirun(tmp_path):
    """docs/launch.md's "In a script" snippet, as written, under torchrun on CPUs (gloo process
    group) and under mpirun: every rank gets a communicator whose all-reduce sums over 2 ranks."""
    import re
    import shutil
    import subprocess
    import sys

    docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "launch.md")
    with open(docs) as f:
        snippet = re.search(r"## In a script\n\n```python\n(.*?)```", f.read(), re.S).group(1)
    script = tmp_path / "script.py"
    script.write_text(snippet + """
import sys
import numpy as np
s = gc.Stream()
x = np.ones(4, np.float32)
comm.all_reduce(x, x, s)
s.synchronize()
with open(f"{sys.argv[1]}/rank{comm.rank}", "w") as f:  # a file each: mpirun may mix the ranks' lines
    f.write(f"{launch.launcher} {comm.rank} {comm.size} {x.tolist()}")
if launch.launcher == "torchrun":  # the end docs/launch.md gives a gloo job (torch 2 can abort at exit without)
    dist.barrier()
    dist.destroy_process_group()
""")

    def results(directory):
        return sorted(p.read_text() for p in directory.iterdir())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "SLURM_"))}
    port = _free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                "127.0.0.1", "--master_port", str(port), "-r", "0:1,1:1", "-t", "0:1,1:1",
                "--log_dir", str(tmp_path / "logs"), str(script), str(tmp_path / "torchrun")]
    (tmp_path / "torchrun").mkdir()
    r = subprocess.run(torchrun, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert results(tmp_path / "torchrun") == [f"torchrun {r} 2 [2.0, 2.0, 2.0, 2.0]" for r in (0, 1)]
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return
    env.update(OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
    (tmp_path / "mpirun").mkdir()
    r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                        sys.executable, str(script), str(tmp_path / "mpirun")], capture_output=True, text=True,
                       timeout=180, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert results(tmp_path / "mpirun") == [f"mpirun {r} 2 [2.0, 2.0, 2.0, 2.0]" for r in (0, 1)]


def test_the_per_call_benchmark_runs_and_checks_its_results():
    r, _ = run_bench("bench_torch_calls.py", "--rounds", 1, "--calls", 20)
    assert "gemm 64^3: gpucloud on torch tensors" in r.stdout and "fill 64x64" in r.stdout, r.stdout


def test_checkpoint_comparison_checks_every_side_loads_what_was_saved(tmp_path):
    """bench/bench_checkpoint_torch.py: saves and loads (cached and cold; gpucloud's verified before
    writing and in one pass) on every side, each result compared with the state saved (a side that
    loaded wrong bytes ends the run)."""
    pytest.importorskip("safetensors")
    _, runs = run_bench("bench_checkpoint_torch.py", "--mib", 4, "--tensors", 3, "--rounds", 2, "--dir",
                        tmp_path / "work", out=tmp_path / "checkpoint.json")
    assert [b["name"] for b in runs] == [
        "checkpoint/save/vs torch.save", "checkpoint/load (cached)/vs safetensors",
        "checkpoint/load (cached, one pass)/vs safetensors", "checkpoint/load (cached)/vs torch.load",
        "checkpoint/load (cold)/vs safetensors", "checkpoint/load (cold, one pass)/vs safetensors",
        "checkpoint/load (cold)/vs torch.load"]
    for b in runs:
        assert b["ratio_min"] <= b["ratio_vs_peer"] <= b["ratio_max"] and b["rounds"] == 2
    assert not (tmp_path / "work").exists()


def test_torch_checkpointer_comparison_checks_both_sides_load_what_was_saved(tmp_path):
    """bench/bench_torch_checkpointer.py: gpucloud.torch.Checkpointer.load (verified before writing,
    and in one pass) against safetensors + load_state_dict, each result compared with the state
    saved (a wrong one ends the run)."""
    pytest.importorskip("safetensors")
    _, runs = run_bench("bench_torch_checkpointer.py", "--mib", 2, "--layers", 2, "--rounds", 2, "--dir",
                        tmp_path / "work", out=tmp_path / "checkpointer.json")
    assert [b["name"] for b in runs] == ["torch checkpointer/load (cached)/vs safetensors + load_state_dict",
                                         "torch checkpointer/load (cached, one pass)/vs safetensors + load_state_dict"]
    for b in runs:
        assert b["ratio_min"] <= b["ratio_vs_peer"] <= b["ratio_max"] and b["rounds"] == 2
    assert not (tmp_path / "work").exists()


def test_convolution_comparison_checks_every_pass_against_aten(tmp_path):
    """bench/bench_conv_torch.py: forward and both backward passes on both sides, each of
    gpucloud's outputs compared with aten's (a wrong one ends the run)."""
    _, runs = run_bench("bench_conv_torch.py", "--batch", 1, "--repeats", 2, "--layers", "res5_3x3",
                        out=tmp_path / "conv.json")
    assert [b["name"].split("/")[2] for b in runs] == ["forward", "backward_data", "backward_filter"]
    for b in runs:
        assert b["ratio_min"] <= b["ratio_vs_torch"] <= b["ratio_max"]
