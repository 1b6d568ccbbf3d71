"""Capture proxy: exact-token capture of agent model calls, the capture graph and the TrainingTrace contract."""
