"""Chaos Toolkit integration: experiment config, controls, actions, probes, runner."""
