"""Why a renting task failed, as exception types a retry policy can tell apart (``airflow_gpumarket.retry_policy``).

Each is an ``AirflowException``, raised after everything the task rented was destroyed (or handed over).
"""

from __future__ import annotations

from dataclasses import replace

from airflow_gpumarket import job_logs
from airflow_gpumarket._compat import AirflowException
from airflow_gpumarket.outcome import EventKind, WaitOutcome


class GpuMarketJobFailed(AirflowException):
    """The job ran and failed: its command exited non-zero (``exit_status``), or its log proves no success.

    :param exit_status: the command's exit status when its log showed one, else None.
    """

    def __init__(self, message: str, *, exit_status: int | None = None) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class GpuMarketNoWorkingOffer(AirflowException):
    """No offer gave a working instance.

    Either none matched the filters and price (or all were taken), or each one tried never ran (a host that failed, a
    boot past ``boot_timeout``).

    :param unmatched: when nothing was tried this try, the search that found nothing to rent (what it searched,
        the offers it saw, the machines host memory skips): what a wait for an offer watches (``wait_for_offer``).
    """

    def __init__(self, message: str, *, unmatched: dict | None = None) -> None:
        super().__init__(message)
        self.unmatched = unmatched


class GpuMarketHostFailed(AirflowException):
    """The host failed under the running job: its instance went exited, unknown or offline before the job ended."""


class GpuMarketPreemptedTooOften(AirflowException):
    """An interruptible job was preempted more than ``max_preemptions`` times."""


class GpuMarketStagingFailed(AirflowException):
    """Durable data did not move: an input or a required checkpoint never reached the job, or an output was lost."""


class GpuMarketBudgetExceeded(AirflowException):
    """A rental's worst case does not fit a budget or the account's credit, or a job reached ``max_cost``.

    Raised before anything is rented, or after the instance that reached ``max_cost`` was destroyed.
    """


class GpuMarketOutcomeUnknown(AirflowException):
    """The wait ended on neither a result nor a known failure: the instance vanished, or the wait itself failed.

    Neither the job's failure nor the market's: the retry policy leaves it to the task's standard retries.
    """


class GpuMarketDestroyFailed(AirflowException):
    """A destroy still failed after the hook's retries: the instance may still bill.

    The message names it, for a person (or the reaper) to destroy it; the retry policy leaves the task to its standard
    retries.
    """


class GpuMarketServiceGone(AirflowException):
    """A task that used a rented service (``connect_service``) found its instance gone or stopped: nobody answers."""


class GpuMarketApprovalRefused(AirflowException):
    """A rental above ``approval_above`` was refused in the Airflow UI, or nobody answered in time: nothing rented."""


def exited_early(instance_id: int, end: job_logs.LogEnd, before: str) -> GpuMarketJobFailed:
    """The failure of a command that exited (``end``, its log's) before ``before``: the job's, not its host's."""
    return GpuMarketJobFailed(
        f"The command on instance {instance_id} exited before {before}; "
        f"{job_logs.failure_detail(end.lines, end.status)}. Check command; every instance of this try is destroyed.",
        exit_status=end.status,
    )


def ended_unseen(job: bool, instance_id: int, end: job_logs.LogEnd, ended: WaitOutcome) -> WaitOutcome:
    """A command that exited before its instance was seen running (``end``): a job's own end, judged by its exit
    status like any job's (``ended``, the wait's outcome, made the job's); any other command's failure, raised."""
    if not job:
        raise exited_early(instance_id, end, "the instance was seen running")
    return replace(ended, kind=EventKind.JOB_FAILED).with_job_end(end.lines, end.status, True)
