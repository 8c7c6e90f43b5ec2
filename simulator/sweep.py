"""Sweeps over warm-pool settings, their Pareto frontier, and recommendations."""

from __future__ import annotations

import argparse

from simulator.run import Inputs


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sweep", action="store_true", help="sweep budgets, idle_grace_s and keep-alive policies")


def run_sweep(args: argparse.Namespace, inputs: Inputs) -> int:
    raise NotImplementedError
