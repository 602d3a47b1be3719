"""Workloads: the test's world (never imported by a runner).

A workload gives the fixture repository placed in every attempt's workspace,
the script of tool calls the model endpoint answers with, the tools' schemas,
and the detectors the grader uses (step markers in an artifact, which step an
external effect belongs to). One module per workload, registered by name.
"""
from __future__ import annotations

from fleet.workloads.base import ToolStep, Workload
from fleet.workloads.hunks8 import Hunks8
from fleet.workloads.longtool import Longtool
from fleet.workloads.patch_repo import PatchRepo
from fleet.workloads.rename4 import Rename4

WORKLOADS: dict[str, Workload] = {w.name: w for w in (PatchRepo(), Rename4(), Hunks8(), Longtool())}


def get(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; valid workloads: {', '.join(sorted(WORKLOADS))}") from None


__all__ = ["WORKLOADS", "ToolStep", "Workload", "get"]
