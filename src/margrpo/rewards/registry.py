"""Imports every built-in backend module so that its @register_reward runs.

Each module listed here must import only light dependencies at module level.
"""
