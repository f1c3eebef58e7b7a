"""Stage prepare_prompts: the world's train / held-out prompt sets and the benchmark sets.

Writes prompts/world_{train,heldout}.jsonl (combination-disjoint splits of the embedded
world, n prompts per GenEval tag and T2I-CompBench category) and normalises the shipped
GenEval and T2I-CompBench prompt files from data/ into prompts/{geneval,t2i_compbench}.jsonl
(one {"prompt", "tag" | "category"} row each), the input a real-model evaluation with
margrpo.eval.protocols needs. The TinyMAR's vocabulary is the world's, so the study itself
evaluates on the world's held-out split.
"""
from pipeline.common import preamble

preamble()

from pathlib import Path  # noqa: E402

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from pipeline import common  # noqa: E402

DATA = Path("data")
T2I_FILES = {  # file stem -> T2I-CompBench category (subset kept for complex)
    "color_val": ("color", None), "shape_val": ("shape", None), "texture_val": ("texture", None),
    "spatial_val": ("spatial", None), "3d_spatial_val": ("3d_spatial", None),
    "non_spatial_val": ("non_spatial", None), "numeracy_val": ("numeracy", None),
    "complex_val": ("complex", None), "complex_val_action": ("complex", "action"),
    "complex_val_spatial": ("complex", "spatial"), "complex_val_spatialaction": ("complex", "spatialaction"),
}


@task(cache_policy=NO_CACHE)
def world_split(split: str, n_per_tag: int, seed: int) -> list[dict]:
    from margrpo.world.prompts import make_prompt_set

    return make_prompt_set(split, n_per_tag, seed)


@task(cache_policy=NO_CACHE)
def benchmark_sets() -> dict[str, list[dict]]:
    from margrpo.world.prompts import read_jsonl

    geneval = read_jsonl(DATA / "geneval" / "evaluation_metadata.jsonl")
    t2i = []
    for stem, (category, subset) in T2I_FILES.items():
        for line in (DATA / "t2i_compbench" / f"{stem}.txt").read_text().splitlines():
            if line.strip():
                row = {"prompt": line.strip(), "category": category}
                if subset:
                    row["subset"] = subset
                t2i.append(row)
    return {"geneval": geneval, "t2i_compbench": t2i}


@flow(name="prepare_prompts", log_prints=False)
def prepare_prompts() -> None:
    from margrpo.world.prompts import write_jsonl

    params = common.load()
    w = params.world
    splits = {
        "train": world_split("train", w.train_prompts_per_tag, w.seed),
        # A different seed for the held-out draw: the splits are disjoint by combination
        # anyway; this only keeps the two draws' orders unrelated.
        "heldout": world_split("heldout", w.heldout_prompts_per_tag, w.seed + 1),
    }
    write_jsonl(splits["train"], common.TRAIN_PROMPTS)
    write_jsonl(splits["heldout"], common.HELDOUT_PROMPTS)
    bench = benchmark_sets()
    for name, rows in bench.items():
        write_jsonl(rows, common.PROMPTS / f"{name}.jsonl")
    counts = {**{f"world_{k}": len(v) for k, v in splits.items()}, **{k: len(v) for k, v in bench.items()}}
    print("prompts:", ", ".join(f"{k}={v}" for k, v in counts.items()))


if __name__ == "__main__":
    prepare_prompts()
