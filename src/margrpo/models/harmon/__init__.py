"""Harmon (wusize/Harmon) text-to-image adapter implementing MARPolicy."""
from margrpo.models.harmon.loading import HARMON_LAYOUT, build_harmon, load_harmon
from margrpo.models.harmon.policy import HarmonPolicy

__all__ = ["HARMON_LAYOUT", "HarmonPolicy", "build_harmon", "load_harmon"]
