"""Measuring: the TTFT bench, the quality and tool-call evals, their tasks, models, servers, stats and reports."""
