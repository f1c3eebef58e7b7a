"""The study report: training curves, comparison tables, the claims table, Markdown + HTML."""
