"""``GpuMarketServiceOperator``: rent a GPU that runs a server, wait until it answers, and hand it to the DAG."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_gpumarket import services
from airflow_gpumarket.exceptions import GpuMarketError, GpuMarketValidationError
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.spec import Terms
from airflow_gpumarket.utils import RunTimeModule, duration_seconds

if TYPE_CHECKING:
    from airflow_gpumarket import api, job_logs, lifecycle, outcome, service_probe
    from airflow_gpumarket.operators import failures
    from airflow_gpumarket.operators.result import RentalResult
else:  # what only a running task needs: not imported when a DAG file is parsed
    api, job_logs = RunTimeModule("airflow_gpumarket.api"), RunTimeModule("airflow_gpumarket.job_logs")
    outcome = RunTimeModule("airflow_gpumarket.outcome")
    service_probe = RunTimeModule("airflow_gpumarket.service_probe")
    failures = RunTimeModule("airflow_gpumarket.operators.failures")


class GpuMarketServiceOperator(GpuMarketCreateInstanceOperator):
    """Rent an instance that runs a server, wait until it answers, and hand it to the DAG: a task group's setup.

    ``command`` starts the server through the job wrapper. It must listen on ``$GPUMARKET_SERVICE_PORT`` (an
    identity port, the same inside the container and outside) over TLS with ``$GPUMARKET_SERVICE_CERT`` and
    ``$GPUMARKET_SERVICE_KEY`` (made on the instance for this rental; the clients pin the certificate), and should
    require ``$GPUMARKET_SERVICE_TOKEN`` as a bearer token, the rental's own credential. Only offers with a direct
    port are searched, and the budget reserves the price over ``lease``. Once the instance runs, the task probes the
    server until it answers; one that does not within ``ready_timeout`` is destroyed, its machine goes into host
    memory, and the next offer is tried. The returned dict adds ``base_url``, ``conn_id`` and ``certificate`` (public:
    the key stays on the instance); tasks reach the server with ``airflow_gpumarket.service_client.connect_service``.
    Pair it with a teardown, as ``CreateInstance``.

    :param command: shell commands that start the server and keep running (templated).
    :param ready_path: the HTTP path probed (``GET``, with the credential); None probes with a TLS handshake.
    :param ready_status: the status a ready server answers at ``ready_path`` (default 200).
    :param ready_timeout: how long after the instance runs the server has to answer (default 15 minutes).
    :param lease: the longest the service lives (default 2 hours): the instance ends the server and destroys
        itself then, and the reaper destroys it past its label's lease should that fail.

    Other parameters: see ``GpuMarketRentingBaseOperator``.
    """

    def __init__(
        self,
        *,
        command: str,
        ready_path: str | None = "/",
        ready_status: int = 200,
        ready_timeout: timedelta | float = timedelta(minutes=15),
        lease: timedelta | float = timedelta(hours=2),
        **kwargs: Any,
    ) -> None:
        if kwargs.get("wait_for_running") is False:
            raise GpuMarketValidationError("wait_for_running", "a service is handed over once it answers; drop it")
        lease = duration_seconds("lease", lease)
        filters = kwargs.get("offer_filters")
        if isinstance(filters, dict) and "direct_port_count" not in filters:
            kwargs["offer_filters"] = {**filters, "direct_port_count": {"gte": 1}}  # the service port needs one
        terms = Terms(waits=True, hands_over=True, lease=lease, serves=True)
        super().__init__(command=command, lease=lease, terms=terms, **kwargs)
        self.ready_path = services.ready_path(ready_path)
        self.ready_status = services.ready_status(ready_status)
        self.ready_timeout = duration_seconds("ready_timeout", ready_timeout)
        self._certificate: str | None = None  # the rental's, once its job's log showed it
        self._probed: service_probe.Round | None = None  # the triggerer's last round, when it probed

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """Resume after the trigger fired; a service's trigger probed the server too (its last round, ``probe``)."""
        probed = event.get("probe") if isinstance(event, dict) else None
        try:
            self._probed = None if probed is None else service_probe.Round.from_dict(probed)
        except (TypeError, ValueError):
            self._probed = None  # not a round this provider wrote: the task probes again itself
        return super().execute_complete(context, event)

    def _wait_trigger(self, **kwargs: Any) -> Any:
        """The instance's wait, then the probe of its server, in the triggerer."""
        from airflow_gpumarket.triggers.services import GpuMarketServiceReadyTrigger

        probe = {"path": self.ready_path, "status": self.ready_status, "timeout": self.ready_timeout}
        return GpuMarketServiceReadyTrigger(probe=probe, **kwargs)

    def _unready(self, rental: lifecycle.Rental, ended: outcome.WaitOutcome) -> job_logs.PreflightFailure | None:
        """Probe the server until it answers (the triggerer did, when deferred); why not, when ``ready_timeout``
        passed or the instance stopped."""
        if ended.kind is not outcome.EventKind.REACHED:
            return None
        assert self.spec is not None and self.session is not None
        if self._probed is not None:
            probed, self._probed = self._probed, None
            return self._judged(rental, probed)
        deadline = self.hook.service_now() + self.ready_timeout  # on the service's clock, as its billing
        certificate = None
        while True:
            self.session.stop_if_killed(rental.instance_id)  # on_kill destroyed it: nothing to probe, nothing to rent
            seen = self.hook.run_flow(self._round(rental, certificate))
            certificate = seen.certificate
            if seen.settles or self.hook.service_now() >= deadline:
                self.session.stop_if_killed(rental.instance_id)  # on_kill ran during the round: not the host's doing
                return self._judged(rental, seen)
            time.sleep(self.spec.poll_interval)

    def _round(self, rental: lifecycle.Rental, certificate: str | None) -> Any:
        """One round of the probe, as a flow either hook runs."""
        return service_probe.round_flow(
            self.hook,
            rental.instance_id,
            label=rental.label or "",
            certificate=certificate,
            path=self.ready_path,
            status=self.ready_status,
        )

    def _judged(self, rental: lifecycle.Rental, seen: service_probe.Round) -> job_logs.PreflightFailure | None:
        """What the probe's last round means: ready (None), the next offer to try (why), or the task's failure."""
        self._certificate = seen.certificate or None
        if seen.certificate == "":
            raise failures.GpuMarketJobFailed(
                f"The service on instance {rental.instance_id} could not make its TLS certificate: openssl failed or "
                "is missing from the image. Install openssl in the image; every instance of this try is destroyed."
            )
        if seen.ready:
            self.log.info("The service of instance %s answers at %s", rental.instance_id, seen.url)
            return None
        if seen.status != api.STATUS_RUNNING:
            return self._stopped(rental, seen.status)
        return job_logs.PreflightFailure("ready", f"{seen.seen}, {self.ready_timeout:g} s after it ran")

    def _stopped(self, rental: lifecycle.Rental, status: str | None) -> job_logs.PreflightFailure:
        """The instance stopped or went before its server answered: a server that exited fails the task; a failed
        preflight is the host's."""
        end = job_logs.end_in_log(self.hook, rental.instance_id)
        if end.job_exited:
            raise failures.exited_early(rental.instance_id, end, "it answered")
        if end.preflight is not None:
            return end.preflight  # the host failed the wrapper's checks: the server never started
        state = "gone" if status is None else repr(status)
        return job_logs.PreflightFailure("ready", f"the instance went {state} before the server answered")

    def _complete(self, result: RentalResult) -> Any:
        done = super()._complete(result)
        done["conn_id"], done["certificate"] = self.gpumarket_conn_id, self._certificate
        try:
            done["base_url"] = services.base_url(self.hook.get_instance(result.rental.instance_id))
        except GpuMarketError as exc:
            self.log.warning("Could not read the address of instance %s: %s", result.rental.instance_id, exc)
        return done
