"""Data parallel on the CPU: two gloo ranks (torchrun) train and evaluate like one process.

The two-process run (tests/distributed_worker.py) trains tiny MAR-GRPO for 4 steps with
held-out evaluation; one plain process does the same. Both start from the same base model
with the same global batch: the final weights agree to float rounding (the gradient of a
sum over two ranks adds in another order); from equal weights the rewards, group
advantages and held-out scores agree exactly. A run checkpointed by two ranks and resumed
by one ends like the others.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from margrpo.models.loading import new_model
from margrpo.models.noise import chain_stream
from margrpo.rl.distributed import World, check_shardable, map_batches, my_batches, torchrun_command
from margrpo.rl.plan import plan_tokens, speculative_steps_needed
from margrpo.rl.trainer import Trainer
from margrpo.world.grammar import VOCAB

from conftest import randomize_head, tiny_params
from distributed_worker import worker_params
from test_trainer import make_trainer

TESTS = Path(__file__).resolve().parent
WEIGHTS = "diffusion_pytorch_model.safetensors"


def _run(cmd: list[str], root: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """ROOT with the outputs of the two-rank run, then of the one-process run."""
    root = tmp_path_factory.mktemp("ddp")
    torch.manual_seed(0)
    randomize_head(new_model(worker_params(), VOCAB), seed=1).save_pretrained(root / "base")
    _run(torchrun_command(2, "distributed_worker", [str(root), "ddp"]), root)
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


def test_two_ranks_train_like_one_process(runs):
    single, ddp = runs / "full_single", runs / "full_ddp"
    diff = _max_diff(single / "final", ddp / "final")
    print(f"max |w_1proc - w_2proc| after 4 steps: {diff:.3g}")
    assert diff <= 1e-6
    moved = _max_diff(runs / "base", single / "final")
    assert moved > 1e-4  # training did change the weights, so the agreement is not trivial
    h1, h2 = _rows(single / "history.jsonl"), _rows(ddp / "history.jsonl")
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
    e1, e2 = _rows(single / "evals.jsonl"), _rows(ddp / "evals.jsonl")
    assert [r["step"] for r in e2] == [0, 2, 4] and e1[0] == e2[0]
    assert all(b == pytest.approx(a, abs=0.05) for a, b in zip(e1, e2))
    assert (ddp / "best" / "best.json").exists()


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


# The stage's own process (train@grpo here), with start_ranks stubbed: it validates params,
# runs the stage's check and would start the ranks, having imported neither torch nor Prefect.
STAGE_PROCESS = """
import sys
import margrpo.rl.launch as launch
from pipeline.common import start_ranks_early
sys.argv = ["pipeline.train", "--method", "grpo"]
launch.start_ranks = lambda n, module, args: print("start", n, module, args, "torch" in sys.modules,
                                                    "prefect" in sys.modules) or 0
start_ranks_early("train", "method", "a method", "doc", "pipeline.train", check=CHECK)
print("returned")
"""


@pytest.mark.parametrize("check, expect", [
    ("None", "start 2 pipeline.train ['--method', 'grpo'] False False"),
    ("lambda p, method: launch.check_shardable(3, p.runtime.nproc)", "train@grpo: failed: ValueError: train.prompts_per_step=3")])
def test_a_stage_process_starts_its_ranks_without_torch_or_prefect(check, expect):
    repo = TESTS.parent
    out = subprocess.run([sys.executable, "-c", STAGE_PROCESS.replace("CHECK", check)], cwd=repo, text=True,
                         capture_output=True, timeout=120, env={**os.environ, "PYTHONPATH": str(repo)})
    assert expect in out.stdout + out.stderr and "returned" not in out.stdout, out.stdout + out.stderr
    assert out.returncode == (0 if check == "None" else 1), out.stdout + out.stderr


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
    ar, heads = tr.plan_steps()
    spec = speculative_steps_needed(tr.method, ar)
    prompts, seeds = [m["prompt"] for m in metas], torch.arange(len(metas)) * 7919 + 3
    full = plan_tokens(tr.policy, tr.policy.rollout(prompts, seeds=seeds, speculative_steps=spec), ar, heads, tr.method, "guided")
    half = slice(len(metas) // 2, len(metas))
    part = plan_tokens(tr.policy, tr.policy.rollout(prompts[half], seeds=seeds[half], speculative_steps=spec), ar, heads,
                   tr.method, "guided")
    for pf, pp in zip(full, part):
        width = pf.mask.shape[1]
        offset = half.start * width
        in_half = pf.draw.rows >= offset
        assert torch.equal(pf.draw.rows[in_half] - offset, pp.draw.rows)  # the same top-k selection
        assert torch.equal(pf.draw.states[:, :, in_half], pp.draw.states)  # the same q-chains, bit for bit
        # the weights come from head evaluations, whose batched matmuls may round differently
        # for another batch size: equal to float32 rounding
        assert torch.allclose(pf.draw.weights[:, in_half], pp.draw.weights, rtol=1e-5, atol=1e-6)
    other = plan_tokens(tr.policy, tr.policy.rollout(prompts, seeds=seeds, speculative_steps=spec), ar, heads, tr.method,
                    "guided", draw=1)
    assert not torch.equal(other[0].draw.states[:, 1:], full[0].draw.states[:, 1:])  # draw 1: fresh chains


def test_chain_streams_are_distinct_and_bounded():
    streams = {chain_stream(p, c, d) for p in (3, 4, 5) for c in range(64) for d in range(3)}
    assert len(streams) == 3 * 64 * 3 and min(streams) >= 8
    with pytest.raises(ValueError, match="purpose"):
        chain_stream(0, 0)
