"""Stage validate: the guard that runs before every other stage, in seconds.

`python -m pipeline.validate` (also by hand). DVC deletes a stage's non-persistent outputs
just before running it, so a bad value must be refused before any other stage starts:
every stage depends on this stage's stamp (reports/validated.txt), the stage is
`always_changed`, and it imports neither Prefect nor torch. It checks
- params.yaml with margrpo.config (types, ranges, unknown keys, cross-field rules, reward
  names and keys, a complete model.checkpoint), then the rules that the stages' code
  would otherwise enforce only once it runs (`params_rules`: prompts per step over the
  ranks, and what the world and the TinyMAR need of the image size and the model);
- that dvc.yaml's train and evaluate stages run once per method of params.yaml, each train
  stage listing the knobs its method reads (the blocks `python -m pipeline.dvcyaml` writes);
- that the training checkpoints the retraining methods would resume from are complete (a
  truncated ckpt.pt otherwise fails every rerun until deleted by hand).
On success it prints what this run will retrain and about how long that takes (from the
committed study's measured step times) and rewrites the stamp with the same bytes, so no
stage downstream reruns because of it. On failure it prints the problems in a few lines and
exits 2; under a workspace `dvc exp run -S ...` it first puts params.yaml back byte for
byte as it was before the command (DVC leaves its rewrite in the workspace otherwise; see
pipeline/restore.py).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import yaml

from margrpo import paramfile
from margrpo.jsonl import read_jsonl
from pipeline import common, proc

STAMP = Path("reports/validated.txt")
STAMP_TEXT = "params.yaml passed pipeline/validate.py (every stage depends on this file, so the check runs first)\n"
# Seconds a stage spends before its work (imports, Prefect's temporary server, MLflow), on 2
# busy cores: 12-45 s measured on tiny params.
STAGE_START_S = 25
# Under this guard `dvc repro pretrain_base` needs the folder to exist: an empty folder is the
# explicit request for a new base (a missing one is a typo until proven otherwise).
NEW_BASE_HINT = "  to pretrain a new base model at {path} instead: mkdir -p {path} && dvc repro pretrain_base"


METHODS_FOREACH = "${methods}"


def check_dvc_yaml(params, path: Path = Path("dvc.yaml")) -> list[str]:
    """dvc.yaml's evaluate stage iterates over params.yaml's methods, and its generated blocks
    (the train stages with the knobs each method reads, the plots) are those that
    `python -m pipeline.dvcyaml` writes for params.yaml, so that the methods and the stages
    cannot drift apart."""
    from pipeline import dvcyaml

    stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {})
    stage = stages.get("evaluate")
    foreach = stage.get("foreach") if isinstance(stage, dict) else None
    if foreach != METHODS_FOREACH:
        return [f"dvc.yaml: stage evaluate iterates over {foreach!r}, not over the methods of params.yaml "
                f"({', '.join(params.methods)})\n    fix: give it `foreach: {METHODS_FOREACH}` (a method "
                f"is then one block under `methods:` in params.yaml)"]
    problems = dvcyaml.problems(params, path)
    if problems and os.environ.get("DVC_EXP_NAME") and dvcyaml.knob_lists_only(params, path):
        # `dvc exp run -S +methods.<m>.consistency=true` (the ablation's tau arm) changes the
        # knobs a method reads, not the methods: train@<m> retrains anyway, since its
        # methods.<m> block changed. Say so, and go on.
        print(f"note: {problems[0].splitlines()[0]}; experiment {os.environ['DVC_EXP_NAME']} changed those "
              "methods' settings, so their train stages rerun regardless")
        return []
    return problems


def check_resume_checkpoints(params, methods: list[str]) -> list[str]:
    """The ckpt.pt files that the training of `methods` would resume from must be whole zip
    files (torch.save's format): a truncated one fails torch.load with a bare OSError."""
    from margrpo.checkfiles import CorruptFileError, check_torch_zip

    from pipeline.train import checkpoint_dir

    if not common.TRAIN_PROMPTS.exists() or not any(Path(params.model.checkpoint).iterdir()):
        return []
    problems = []
    for method in methods:
        for seed in params.train.seeds:
            ckpt = checkpoint_dir(params, method, seed) / "ckpt.pt"
            if ckpt.exists():
                try:
                    check_torch_zip(ckpt, f"move it aside to restart seed {seed} of {method} from step 0: "
                                          f"mv {ckpt} {ckpt}.damaged")
                except CorruptFileError as err:
                    problems.append(f"train@{method}: {err}")
    return problems


def _lock_params(lock: dict, stage: str) -> dict | None:
    entry = lock.get("stages", {}).get(stage)
    return None if entry is None else entry.get("params", {}).get("params.yaml", {})


def to_retrain(params, raw: dict) -> list[str]:
    """Methods whose training reruns: trained model missing from the workspace (a fresh
    clone: models are DVC-cached and the repo has no DVC remote) or params changed since
    dvc.lock. Code changes are DVC's to see, not ours."""
    lock = yaml.safe_load(Path("dvc.lock").read_text()) if Path("dvc.lock").exists() else {}
    out = []
    for method in params.methods:
        missing = any(not (common.trained_model_dir(method, s) / "final").exists() for s in params.train.seeds)
        locked = _lock_params(lock, f"train@{method}")
        changed = locked is None or any(paramfile.get(raw, k) != v for k, v in locked.items())
        if missing or changed:
            out.append(method)
    return out


def _tagged(path) -> int:
    return sum(1 for line in open(path) if json.loads(line).get("tag")) if path.exists() else 0


def _mean_step_s(seeds_dir: Path) -> float | None:
    """Seconds per training step over whole committed runs (history.jsonl of every seed):
    unlike the final window's mean it counts the first step's warm-up and the gradient-probe
    steps. On the committed study the final-window mean missed 21% of the training time;
    with the whole runs the estimate for a fresh clone is 55 min against 53.6 measured."""
    times = [row.get("time/step", 0.0) for path in sorted(seeds_dir.glob("seed*/history.jsonl"))
             for row in read_jsonl(path)]
    return sum(times) / len(times) if times else None


def estimate_minutes(params, methods: list[str]) -> float | None:
    """Training + evaluation time of `methods` and the report, from the committed study's
    measured step and evaluation times (reports/train|eval/<method>/metrics.json) on this
    machine class, plus each stage's start-up (imports, Prefect's server, MLflow). A method
    without measured times (new in params.yaml) is timed as the slowest measured one; None
    when none is measured."""
    measured = {m: _method_seconds(params, m) for m in methods}
    known = [s for s in measured.values() if s is not None]
    if not known:
        return None
    total = STAGE_START_S * (2 * len(methods) + 1)
    return (total + sum(s if s is not None else max(known) for s in measured.values())) / 60


def _method_seconds(params, m: str) -> float | None:
    """Seconds of train@m and evaluate@m from m's committed records; None without them."""
    try:
        train = json.loads((common.REPORTS / "train" / m / "metrics.json").read_text())
        ev = json.loads((common.REPORTS / "eval" / m / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    step_s = _mean_step_s(common.REPORTS / "train" / m / "seeds") or train["final_window"]["mean"].get("time/step")
    if step_s is None:
        return None
    t, seeds = params.train_for(m), len(params.train.seeds)
    total = step_s * t.steps * seeds
    per_image = ev.get("time/eval_s", 0.0) / max(1, ev.get("images", 1))
    # evaluate@<method>: the final and the best checkpoint of each seed on the test split
    total += per_image * _test_images(params) * seeds * 2
    # in-training evaluations (step 0, every eval_every steps, the last step) of the
    # held-out GenEval-tag prompts
    if t.eval_every > 0:
        evals = 1 + t.steps // t.eval_every + (t.steps % t.eval_every > 0)
        total += per_image * _tagged(common.HELDOUT_PROMPTS) * t.eval_images_per_prompt * evals * seeds
    return total


def _test_images(params) -> int:
    """Images one evaluation replicate samples on the committed test prompts."""
    from margrpo.jsonl import read_jsonl
    from margrpo.world.generate import allocate_images

    if not common.TEST_PROMPTS.exists():
        return 0
    e = params.evaluate
    return sum(allocate_images(read_jsonl(common.TEST_PROMPTS), e.images_per_prompt, e.images_per_tag))


def plan(params, raw: dict, text: str) -> str:
    from margrpo.tracking.runs import params_hash

    head = f"validate: params.yaml OK (params {params_hash(text)}, {common.exp_name()})"
    methods = to_retrain(params, raw)
    if not methods:
        return f"{head}; every method's trained model is in place: only stages whose inputs changed rerun"
    minutes = estimate_minutes(params, methods)
    steps = sorted({params.train_for(m).steps for m in methods})
    cost = f"about {minutes:.0f} min on 2 CPU cores" if minutes is not None else "time unknown (no measured step times)"
    return (f"{head}; retrains {', '.join(methods)} ({len(params.train.seeds)} seed(s) x "
            f"{' or '.join(map(str, steps))} steps each): {cost} "
            f"for their training and evaluation. A trained model is missing on a fresh clone (DVC cache, no remote). "
            f"For a short run that leaves this workspace alone: python -m pipeline.quick")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def longest_prompt_words() -> int:
    """Words in the world's longest prompt: two noun phrases of an article or number, every
    attribute and a shape, joined by the longest relation (12: "a small striped red circle
    left of a large striped blue square"); the TinyMAR's tokenizer refuses longer ones."""
    from margrpo.world import grammar

    phrase = 2 + len(grammar.ATTRIBUTES)
    return 2 * phrase + max(len(r.split()) for r in grammar.RELATIONS)


def params_rules(params) -> list[tuple[str, str, str]]:
    """(dotted key, problem, fix) for each rule of params alone that a stage's code would
    otherwise enforce only once DVC has started the stage (and deleted its cached outputs):
    the ranks that fit this machine and split every method's prompts per step into whole
    groups (margrpo.ranks.launch.rank_problems: runtime.nproc, nnodes, rdzv_endpoint), the even
    image size of the world's renderer, reward and judge (world/render.py check_size), and
    the TinyMAR's heads and prompt length (models/encoder.py, models/tokenizer.py)."""
    from margrpo.ranks.launch import rank_problems

    out = rank_problems(params)
    size = params.world.image_size
    if size % 2:
        out.append(("world.image_size", f"{size} is odd; the world's images are a 2x2 grid of cells",
                    "use an even size with a model.patch_size that divides it"))
    m = params.model
    if m.kind == "tiny" and m.width % m.heads:
        out.append(("model.heads", f"{m.heads} heads do not divide model.width={m.width}",
                    f"use one of {', '.join(str(d) for d in _divisors(m.width) if d <= 64)}, or another width"))
    words = longest_prompt_words()
    if m.kind == "tiny" and m.max_prompt_len < words:
        out.append(("model.max_prompt_len", f"{m.max_prompt_len} words is shorter than the world's longest "
                    f"prompts ({words} words)", f"set it to at least {words}"))
    return out


def rules_message(rules: list[tuple[str, str, str]], source: str, lines: dict, shown: dict) -> str:
    """params_rules' problems in margrpo.config's form: the file, the line, the key, the fix."""
    entries = []
    for key, message, fix in rules:
        path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
        entries.append((lines.get(path, 10**9),
                        f"{paramfile.where(source, lines, path, shown)}{key}: {message}\n    fix: {fix}"))
    return paramfile.problems_text(source, entries)


def problems_of(path: Path, text: str | None = None, lines: dict | None = None,
                set_keys: list[str] = ()) -> tuple[list[str], object, dict]:
    """(problems, Params or None, the raw params tree) of the file at `path`, or of `text`
    named `path`. lines / set_keys: where the messages place the keys (default: the
    lines of the text), and the keys they show as `-S` overrides instead."""
    from margrpo.config import ParamsError, parse_params

    source = str(path)
    try:
        raw, own_lines = paramfile.read_yaml(path) if text is None else paramfile.parse_yaml(text, path)
    except ParamsError as err:
        return [str(err)], None, {}
    lines = own_lines if lines is None else lines
    shown = {}  # set again to the values they have: the messages then name the override
    for key in set_keys:
        found, value = paramfile.lookup(raw, key)
        if found:
            shown[key] = value
    # An empty model.checkpoint folder asks for a new base there: pretrain_base will fill it.
    ckpt = Path(str(paramfile.get(raw, "model.checkpoint", "")) or ".")
    new_base = ckpt.is_dir() and not any(ckpt.iterdir())
    try:
        params = parse_params(raw, source, shown, require_checkpoint=not new_base, lines=lines)
    except ParamsError as err:
        hint = [NEW_BASE_HINT.format(path=ckpt)] if "model.checkpoint" in str(err) and not ckpt.exists() else []
        return [str(err), *hint], None, raw if isinstance(raw, dict) else {}
    rules = params_rules(params)
    if rules:
        return [rules_message(rules, source, lines, shown)], params, raw
    problems = check_dvc_yaml(params)
    problems += check_resume_checkpoints(params, to_retrain(params, raw)) if not problems else []
    return problems, params, raw


def relocated(path: Path, text: str, set_keys: list[str]) -> list[str]:
    """The problems of `text`, DVC's -S rewrite of the params file at `path`, once the file
    is put back: each key at its line in the file as it now is, the keys that the -S values
    set shown as overrides."""
    try:
        _, lines = paramfile.read_yaml(path)
    except ValueError:  # the file as it was does not parse: no lines to give
        lines = {}
    return problems_of(path, text, lines, set_keys)[0]


def refuse(path: Path, text: str, problems: list[str]) -> None:
    """Print the problems and exit 2; under a workspace `dvc exp run -S`, first put the
    params file back as it was before the command."""
    from pipeline.restore import restore_after_rejected_exp_run

    restored, set_keys = restore_after_rejected_exp_run()
    if restored and path.read_text() != text:
        problems = relocated(path, text, set_keys) or problems
    sys.stderr.write("validate: nothing ran, no output was touched:\n" + "\n".join(
        "  " + line for p in problems for line in p.splitlines()) + "\n")
    for line in restored:
        sys.stderr.write(f"validate: {line}\n")
    sys.exit(2)


def main() -> None:
    t0 = time.time()
    proc.hold_repo_lock()
    path = common.PARAMS_FILE
    if not path.exists():
        sys.stderr.write("validate: params.yaml not found; run from the repository root\n")
        sys.exit(2)
    text = path.read_text()
    problems, params, raw = problems_of(path)
    if problems:
        refuse(path, text, problems)
    print(plan(params, raw, text) + f" [{time.time() - t0:.1f} s]", flush=True)
    if not STAMP.exists() or STAMP.read_text() != STAMP_TEXT:
        common.write_text(STAMP_TEXT, STAMP)


if __name__ == "__main__":
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    main()
