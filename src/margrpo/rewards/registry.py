"""Imports every built-in backend module so that its @register_reward runs.

Each module listed here must import only light dependencies at module level.
"""

import margrpo.rewards.aesthetic  # noqa: E402,F401
import margrpo.rewards.clipscore  # noqa: E402,F401
import margrpo.rewards.pickscore  # noqa: E402,F401
import margrpo.rewards.remote  # noqa: E402,F401
import margrpo.rewards.hps  # noqa: E402,F401
import margrpo.rewards.imagereward  # noqa: E402,F401
import margrpo.rewards.vqascore  # noqa: E402,F401
import margrpo.rewards.world  # noqa: E402,F401
