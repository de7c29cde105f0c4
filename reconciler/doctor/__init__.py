"""Host hygiene: checks of a TPU's hosts before every start and on request (`ledger doctor`).

Each check (one module each: devices + libtpu lock, leftovers, mounts + disk, versions) is a
name, a probe (a shell fragment from quoted parts; all of a host's fragments run in one SSH
round trip), a verdict, and a fix where one is safe. `Doctor` runs them over the SSH runner;
`records` ties them to the ledger: whose a process is, and every repair as intent + outcome.
"""

from reconciler.doctor.model import Check, Context, Facts, Finding, Fix, JobInfo, Paths, Proc
from reconciler.doctor.records import Gate, LedgerJobs, clean, context
from reconciler.doctor.run import CHECKS, Doctor, Report, judge

__all__ = ["CHECKS", "Check", "Context", "Doctor", "Facts", "Finding", "Fix", "Gate", "JobInfo", "LedgerJobs",
           "Paths", "Proc", "Report", "clean", "context", "judge"]
