"""Data parallel on the CPU: gloo ranks (torchrun) train and evaluate like one process.

The two-process run (tests/distributed_worker.py) trains tiny MAR-GRPO for 4 steps with
held-out evaluation; one plain process does the same. Both start from the same base model
with the same global batch: the final weights agree to float rounding (the gradient of a
sum over two ranks adds in another order); from equal weights the rewards, group
advantages and held-out scores agree exactly. A run checkpointed by two ranks and resumed
by one ends like the others. Two "nodes" of one rank each, started apart as a scheduler
would and meeting at a c10d rendezvous on localhost, train like one process too.

Without processes: how many ranks runtime.nproc / nnodes give on a CPU, one GPU and N GPUs
(margrpo.ranks.launch), and the stage process that starts them without torch or Prefect.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from margrpo.models.loading import new_model
from margrpo.models.noise import chain_stream
from margrpo.paramfile import ParamsError
from margrpo.ranks import launch
from margrpo.ranks.distributed import World, check_shardable, map_batches, my_batches
from margrpo.method.plan import plan_tokens, speculative_steps_needed
from margrpo.training.trainer import Trainer
from margrpo.world.grammar import VOCAB

from conftest import randomize_head, tiny_params
from distributed_worker import worker_params
from test_trainer import make_trainer

TESTS = Path(__file__).resolve().parent
WEIGHTS = "diffusion_pytorch_model.safetensors"


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}


def _run(cmd: list[str], root: Path) -> None:
    out = subprocess.run(cmd, cwd=root, env=_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def _base(root: Path) -> None:
    torch.manual_seed(0)
    randomize_head(new_model(worker_params(), VOCAB), seed=1).save_pretrained(root / "base")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """ROOT with the outputs of the two-rank run, then of the one-process run."""
    root = tmp_path_factory.mktemp("ddp")
    _base(root)
    _run(launch.torchrun_command(2, "distributed_worker", [str(root), "ddp"]), root)
    _run([sys.executable, "-m", "distributed_worker", str(root), "single"], root)
    return root


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / WEIGHTS)


def _max_diff(a: Path, b: Path) -> float:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _trains_like_one_process(root: Path, single: Path, ranks: Path) -> None:
    """The final weights within 1e-6 of one process's, the step metrics alike."""
    diff = _max_diff(single / "final", ranks / "final")
    print(f"max |w_1proc - w_{ranks.name}| after 4 steps: {diff:.3g}")
    assert diff <= 1e-6
    moved = _max_diff(root / "base", single / "final")
    assert moved > 1e-4  # training did change the weights, so the agreement is not trivial
    h1, h2 = _rows(single / "history.jsonl"), _rows(ranks / "history.jsonl")
    assert [r["step"] for r in h2] == [1, 2, 3, 4]
    rewards = ("reward/mean", "reward/std", "reward/min", "reward/max", "adv/zero_std_frac")
    # step 1, from the same weights: the same images and rewards, gathered exactly
    assert all(h1[0][k] == h2[0][k] for k in rewards)
    for a, b in zip(h1, h2):  # later steps: weights that differ by rounding
        for key in (*rewards, "loss/policy", "loss/kl", "diag/grad_norm_ar", "probe/snr"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), (a["step"], key)
    assert "probe/cos_draws" in h2[0] and "select/ess" in h2[0]  # probed at steps 1 and 3
    # held-out evaluation shared over the ranks: at step 0 (the same weights) exactly the
    # single-process scores; later ones score weights that differ by rounding
    e1, e2 = _rows(single / "evals.jsonl"), _rows(ranks / "evals.jsonl")
    assert [r["step"] for r in e2] == [0, 2, 4] and e1[0] == e2[0]
    assert all(b == pytest.approx(a, abs=0.05) for a, b in zip(e1, e2))
    assert (ranks / "best" / "best.json").exists()


def test_two_ranks_train_like_one_process(runs):
    _trains_like_one_process(runs, runs / "full_single", runs / "full_ddp")


# A node's stage process: start_ranks with the ranks' runtime, as pipeline/proc.py calls it,
# torch-free. It reads only the runtime and the batch from params; the ranks build their own
# (worker_params, whose test reward is registered by conftest, which imports torch).
NODE = """
import json, sys
from margrpo.config import parse_params
from margrpo.ranks.launch import start_ranks
params = parse_params(json.loads(sys.argv[2]), "the launch test's params")
sys.exit(start_ranks(params, "distributed_worker", [sys.argv[1], "nodes", "--train-only"]))
"""


def _node_params(endpoint: str) -> str:
    runtime = {"runtime.nnodes": 2, "runtime.nproc": 1, "runtime.rdzv_endpoint": endpoint}
    return json.dumps({**worker_params(**runtime).model_dump(mode="json"), "rewards": [{"name": "world"}]})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_nodes_meet_at_a_c10d_rendezvous_and_train_like_one_process(tmp_path):
    """Two stage processes started apart (as `srun` starts one per node), one rank each,
    joined by torchrun's c10d rendezvous on localhost over gloo; one plain process with the
    same global batch. Both write into the same folder, as nodes on one shared filesystem."""
    _base(tmp_path)
    endpoint = f"localhost:{_free_port()}"
    t0 = time.time()
    nodes = [subprocess.Popen([sys.executable, "-c", NODE, str(tmp_path), _node_params(endpoint)], cwd=tmp_path, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    _run([sys.executable, "-m", "distributed_worker", str(tmp_path), "single", "--train-only"], tmp_path)
    outs = [node.communicate(timeout=300)[0] for node in nodes]
    print(f"two nodes and one process: {time.time() - t0:.1f} s")
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(out[-3000:] for out in outs)
    places = [json.loads((tmp_path / f"place_nodes_{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(p["GROUP_RANK"] for p in places) == [0, 1]  # two nodes ...
    assert all(p["WORLD_SIZE"] == 2 and p["LOCAL_WORLD_SIZE"] == 1 for p in places)  # ... of one rank each
    _trains_like_one_process(tmp_path, tmp_path / "full_single", tmp_path / "full_nodes")


def test_resume_with_another_number_of_processes(runs):
    """Checkpointed by two ranks at step 2, resumed by one process to step 4."""
    diff = _max_diff(runs / "full_single" / "final", runs / "switch" / "final")
    print(f"max |w_1proc - w_(2 then 1 proc)|: {diff:.3g}")
    assert diff <= 1e-6
    assert [r["step"] for r in _rows(runs / "switch" / "history.jsonl")] == [1, 2, 3, 4]


def test_sharded_evaluation_gathers_exact_per_image_scores(runs):
    one, two = torch.load(runs / "eval_single.pt"), torch.load(runs / "eval_ddp.pt")
    assert torch.equal(one["images"], two["images"])  # 5 batches of 4 dealt over two ranks
    assert one["scores"].keys() == two["scores"].keys() >= {"geneval", "partial", "aligned"}
    for key, value in one["scores"].items():
        assert torch.equal(value.isnan(), two["scores"][key].isnan())
        assert torch.equal(value.nan_to_num(), two["scores"][key].nan_to_num()), key


# ---- without processes ------------------------------------------------------------------
def test_a_step_that_does_not_split_over_the_ranks_is_refused():
    check_shardable(4, 2)
    with pytest.raises(ValueError, match=r"train.prompts_per_step=3 does not split over runtime.nproc=2.*multiple"):
        check_shardable(3, 2)
    params = tiny_params(**{"train.prompts_per_step": 3})
    with pytest.raises(ValueError, match="prompts_per_step=3"):  # before any rollout
        Trainer(new_model(params, VOCAB), params, params.method("grpo"), 0, [], None, world=World(0, 2))


# The stage's own process (train@grpo here, on params.yaml with `-S`-like overrides), with
# start_ranks stubbed: importing the stage runs nothing; its main validates params, works out
# the ranks and would start them, having imported neither torch nor Prefect.
STAGE_PROCESS = """
import sys
from margrpo import config
import margrpo.ranks.launch as launch
import pipeline.proc as proc
load = config.load_params
config.load_params = lambda path: load(path, OVERRIDES)
proc._start_reaper = lambda: None
import pipeline.train as train
imported = "torch" in sys.modules, "prefect" in sys.modules, proc.signal.getsignal(proc.signal.SIGTERM) is proc._on_sigterm
launch.start_ranks = lambda params, module, args: print("start", launch.ranks_per_node(params), module, args,
                                                       "torch" in sys.modules, "prefect" in sys.modules) or 0
sys.argv = ["pipeline.train", "--method", "grpo"]
print("imported", imported == (False, False, False))
train.proc.main("train", train.train_method, key=("method", "a method"), ranks=True)
print("returned")
"""


@pytest.mark.parametrize("overrides, status, expect", [
    ({"runtime.nproc": 2, "runtime.device": "cpu"}, 0, "start 2 pipeline.train ['--method', 'grpo'] False False"),
    ({"runtime.nproc": "auto", "runtime.device": "cpu"}, 0, "start 2 pipeline.train"),
    ({"runtime.nproc": 3, "runtime.device": "cpu"}, 2, "train@grpo: runtime.nproc: 3 ranks cannot split the prompts")])
def test_a_stage_process_starts_its_ranks_without_torch_or_prefect(overrides, status, expect):
    repo = TESTS.parent
    code = STAGE_PROCESS.replace("OVERRIDES", repr(overrides))
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, text=True, capture_output=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(repo)})
    assert "imported True" in out.stdout, out.stdout + out.stderr  # importing the stage ran nothing
    assert expect in out.stdout + out.stderr and "returned" not in out.stdout, out.stdout + out.stderr
    assert out.returncode == status, out.stdout + out.stderr


# ---- ranks per node: CPU, one GPU, N GPUs, several nodes ------------------------------------
def _ranks(monkeypatch, gpus: int, **runtime):
    monkeypatch.setattr(launch, "visible_gpus", lambda: gpus)
    params = tiny_params(**{"train.prompts_per_step": 8, **{f"runtime.{k}": v for k, v in runtime.items()}})
    return launch.ranks_per_node(params), launch.rank_problems(params)


@pytest.mark.parametrize("gpus, device, expect", [
    (0, "auto", 2), (0, "cpu", 2), (1, "auto", 1), (1, "cpu", 2), (4, "auto", 4), (4, "cuda", 4),
    (3, "auto", 2),   # 8 prompts per step: 3 ranks would split a group, so 2
    (16, "cuda", 8)])
def test_auto_ranks_fit_the_machine_and_the_batch(monkeypatch, gpus, device, expect):
    assert _ranks(monkeypatch, gpus, device=device, nproc="auto") == (expect, [])


def test_the_default_runtime_fits_a_cpu_one_gpu_and_n_gpus(monkeypatch):
    monkeypatch.setattr(launch, "visible_gpus", lambda: 0)
    params = tiny_params(**{"runtime": {}})  # RuntimeConfig's defaults
    assert params.runtime.nproc == "auto" and launch.ranks_per_node(params) == launch.CPU_RANKS
    for gpus in (1, 2):
        monkeypatch.setattr(launch, "visible_gpus", lambda: gpus)
        assert launch.ranks_per_node(params) == gpus and launch.rank_problems(params) == []


def test_ranks_that_do_not_fit_are_refused_naming_the_key(monkeypatch):
    with pytest.raises(ParamsError, match=r"runtime.nproc: 2 ranks need one GPU each and this machine shows 1"):
        _ranks(monkeypatch, 1, device="auto", nproc=2)
    with pytest.raises(ParamsError, match=r"(?s)runtime.nnodes: 3 nodes cannot split.*use one of 1, 2, 4, 8 nodes"):
        _ranks(monkeypatch, 0, nproc="auto", nnodes=3)
    with pytest.raises(ParamsError, match=r"runtime.nproc: 2 ranks on each of 8 nodes cannot split"):
        _ranks(monkeypatch, 0, nproc=2, nnodes=8, rdzv_endpoint="n1:29500")
    assert _ranks(monkeypatch, 0, nproc="auto", nnodes=8, rdzv_endpoint="n1:29500") == (1, [])


def test_validate_refuses_ranks_that_do_not_fit_before_any_stage(monkeypatch):
    from pipeline.validate import params_rules

    monkeypatch.setattr(launch, "visible_gpus", lambda: 1)
    rules = params_rules(tiny_params(**{"runtime.device": "auto", "runtime.nproc": 2}))
    assert [key for key, _, _ in rules] == ["runtime.nproc"] and "set runtime.nproc to auto" in rules[0][2]
    assert params_rules(tiny_params(**{"runtime.device": "auto", "runtime.nproc": "auto"})) == []


def test_the_rendezvous_endpoint_comes_from_params_or_the_environment(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    params = tiny_params(**{"runtime.nnodes": 2, "runtime.nproc": 1})
    with pytest.raises(ParamsError, match="runtime.rdzv_endpoint: 2 nodes need a rendezvous endpoint"):
        launch.rendezvous_endpoint(params.runtime)
    assert [key for key, _, _ in launch.rank_problems(params)] == ["runtime.rdzv_endpoint"]
    monkeypatch.setenv("MASTER_ADDR", "node01")
    assert launch.rendezvous_endpoint(params.runtime) == "node01:29500"
    monkeypatch.setenv("MASTER_PORT", "6000")
    assert launch.rendezvous_endpoint(params.runtime) == "node01:6000"
    given = tiny_params(**{"runtime.nnodes": 2, "runtime.rdzv_endpoint": "head:7000"})
    assert launch.rendezvous_endpoint(given.runtime) == "head:7000"  # params win over the environment
    cmd = launch.torchrun_command(4, "pipeline.train", ["--method", "grpo"], 2, "head:7000")
    assert cmd[3:8] == ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=head:7000",
                        "--rdzv-id=pipeline.train---method-grpo", "--nproc-per-node=4"]
    assert "--standalone" in launch.torchrun_command(2, "pipeline.train", [])


@pytest.mark.parametrize("visible, expect", [(None, 4), ("", 0), ("1,3", 2), ("0,-1,2", 1), ("0,1,2,3,4,5", 4)])
def test_visible_gpus_reads_the_driver_and_cuda_visible_devices(monkeypatch, tmp_path, visible, expect):
    gpus = tmp_path / "gpus"
    for i in range(4):
        (gpus / f"0000:0{i}:00.0").mkdir(parents=True)
    real = launch.Path
    monkeypatch.setattr(launch, "Path", lambda p: gpus if p == "/proc/driver/nvidia/gpus" else real(p))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert launch.visible_gpus() == expect


def test_shards_and_batches_cover_everything_once():
    assert [World(r, 3).shard(12) for r in range(3)] == [slice(0, 4), slice(4, 8), slice(8, 12)]
    assert my_batches(10, 3, World(0, 2)) == [slice(0, 3), slice(6, 9)]  # round-robin
    assert my_batches(10, 3, World(1, 2)) == [slice(3, 6), slice(9, 10)]
    assert my_batches(2, 3, World(1, 2)) == []  # a rank with no batch still joins the gather
    assert map_batches(lambda s: (s.start, s.stop), 10, 3, World()) == [(0, 3), (3, 6), (6, 9), (9, 10)]


def test_a_shard_draws_the_same_chains_for_its_images():
    """plan_tokens() on one rank's half of the groups draws, for each of its images, exactly the
    multi-trajectory chains that one process draws for them in the whole batch."""
    tr = make_trainer(**{"methods.mar_grpo.estimator": "posterior", "num_trajectories": 3})
    metas, _ = tr.sample_batch()
    ar, heads, _ = tr.plan_steps()
    spec = speculative_steps_needed(tr.method, ar)
    prompts, seeds = [m["prompt"] for m in metas], torch.arange(len(metas)) * 7919 + 3
    def plan(prompts, seeds, draw=0):
        ro = tr.policy.rollout(prompts, seeds=seeds, speculative_steps=spec)
        return plan_tokens(tr.scorer(ro), ro, ar, heads, tr.method, draw=draw)

    full = plan(prompts, seeds)
    half = slice(len(metas) // 2, len(metas))
    part = plan(prompts[half], seeds[half])
    for pf, pp in zip(full, part):
        width = pf.mask.shape[1]
        offset = half.start * width
        in_half = pf.draw.rows >= offset
        assert torch.equal(pf.draw.rows[in_half] - offset, pp.draw.rows)  # the same top-k selection
        assert torch.equal(pf.draw.states[:, :, in_half], pp.draw.states)  # the same q-chains, bit for bit
        # the weights come from head evaluations, whose batched matmuls may round differently
        # for another batch size: equal to float32 rounding
        assert torch.allclose(pf.draw.weights[:, in_half], pp.draw.weights, rtol=1e-5, atol=1e-6)
    other = plan(prompts, seeds, draw=1)
    assert not torch.equal(other[0].draw.states[:, 1:], full[0].draw.states[:, 1:])  # draw 1: fresh chains


def test_chain_streams_are_distinct_and_bounded():
    streams = {chain_stream(p, c, d) for p in (3, 4, 5) for c in range(64) for d in range(3)}
    assert len(streams) == 3 * 64 * 3 and min(streams) >= 8
    with pytest.raises(ValueError, match="purpose"):
        chain_stream(0, 0)
