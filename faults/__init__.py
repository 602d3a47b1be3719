"""Fault catalog: one small class per fault kind, registered under its public id."""
from faults.base import CATALOG, Fault, FaultContext, FaultSpec, Receipt, register  # noqa: F401
from faults import credentials, disk, network, preempt, storage_faults  # noqa: F401  (registration)
