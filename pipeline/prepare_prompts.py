"""Stage prepare_prompts: the world's train / held-out prompt sets.

Writes prompts/world_{train,heldout,test}.jsonl: combination-disjoint splits of the embedded
world, n prompts per GenEval tag and T2I-CompBench category (heldout for validation during
training and model selection), and the test split of distinct prompts for the headline
numbers, with the never-trained bindings (subset "novel") reported apart. The folder is committed
(`cache: false`), so a fresh clone has it; the TinyMAR's vocabulary is the world's, so the
study trains and evaluates on these splits. (A real-model evaluation with
margrpo.eval.protocols reads the GenEval and T2I-CompBench prompt files in data/ directly.)
"""
from __future__ import annotations

from pipeline import common, proc


@proc.task()
def world_split(split: str, n_per_tag: int, seed: int, novel_per_tag: int = 0) -> list[dict]:
    from margrpo.world.prompts import make_prompt_set, make_test_set

    return make_test_set(n_per_tag, novel_per_tag, seed) if split == "test" else make_prompt_set(split, n_per_tag, seed)


@proc.flow("prepare_prompts", log_prints=False)
def prepare_prompts() -> None:
    from margrpo.jsonl import write_jsonl

    params = common.load()
    study = proc.open_study(params)
    run_id = study.child("prepare_prompts")
    w = params.world
    splits = {
        "train": world_split("train", w.train_prompts_per_tag, w.seed),
        # A different seed for the held-out draw: the splits are disjoint by combination
        # anyway; this only keeps the two draws' orders unrelated.
        "heldout": world_split("heldout", w.heldout_prompts_per_tag, w.seed + 1),
        # Headline numbers only: never used for model selection (the held-out split is).
        # Distinct prompts, each with its subset: test, unseen_tag or novel (world/prompts.py).
        "test": world_split("test", w.test_prompts_per_tag, w.seed + 2, w.novel_prompts_per_tag),
    }
    staged = common.staging_dir(common.PROMPTS)
    for name, rows in splits.items():
        write_jsonl(rows, staged / f"world_{name}.jsonl")
    common.replace_dir(staged, common.PROMPTS)
    counts = {f"prompts/world_{k}": len(v) for k, v in splits.items()}
    study.log_metrics(run_id, counts)
    study.log_artifact(run_id, common.PROMPTS, "prompts")
    study.finish(run_id)
    print("prompts:", ", ".join(f"{k}={v}" for k, v in counts.items()))


if __name__ == "__main__":
    proc.main("prepare_prompts", prepare_prompts)
