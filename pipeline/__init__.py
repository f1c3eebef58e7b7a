"""The study pipeline: one Prefect flow per DVC stage (`python -m pipeline.<stage>`).

Each module is a thin shell: it validates params.yaml, opens the study's MLflow runs and
calls library functions in `margrpo`; dvc.yaml decides what runs when.
"""
