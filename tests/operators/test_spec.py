"""RentalSpec (operators/spec.py): every argument rule, the create body and the job script, the lease, limits and
watch of a rental, and the values by which the renting operators differ (``Terms``). Driven through its methods."""

from __future__ import annotations

import pytest

from airflow_gpumarket import lifecycle
from airflow_gpumarket.exceptions import GpuMarketValidationError
from airflow_gpumarket.operators.create_instance import GpuMarketCreateInstanceOperator
from airflow_gpumarket.operators.run_job import GpuMarketRunJobOperator
from airflow_gpumarket.operators.spec import JOB_LEASE_MARGIN_SECONDS, RentalSpec, Terms

OK = {"offer_filters": {"gpu_name": {"eq": "RTX 4090"}}, "image": "pytorch/pytorch"}
CREATE = GpuMarketCreateInstanceOperator
FILTERS = {"gpu_name": {"eq": "RTX 4090"}}
LABEL = "afgm-0123456789ab-1"


def job_spec(**kwargs) -> RentalSpec:
    return RentalSpec.of(GpuMarketRunJobOperator(task_id="t", command="python t.py", **{**OK, **kwargs}))


def rental(**fields) -> lifecycle.Rental:
    return lifecycle.Rental(1001, 1, 0.5, "RTX 4090", LABEL, 1000.0, **fields)


def test_templated_fields_are_checked_after_rendering_not_at_parse_time():
    op = CREATE(task_id="t", **OK, runtype="{{ params.runtype }}", disk="{{ params.disk }}")
    op.instance.update(runtype="bogus", disk=8)  # as rendering would make them
    with pytest.raises(GpuMarketValidationError, match="^runtype"):
        RentalSpec.of(op)


def test_good_arguments_build_a_body_with_only_given_fields():
    op = CREATE(task_id="t", **OK, disk=16, env={"A": "1", "-p 8080:8080": "1"})
    body = RentalSpec.of(op).creation_body(label="afgm-0123456789ab-1", base_url=None)
    assert body == {
        "image": "pytorch/pytorch",
        "label": "afgm-0123456789ab-1",
        "disk": 16,
        "env": {"A": "1", "-p 8080:8080": "1"},
        "cancel_unavail": True,
    }


def test_the_fields_may_come_as_one_instance_dict_and_are_sent_as_given():
    op = GpuMarketCreateInstanceOperator(
        task_id="t", offer_filters=FILTERS, instance={"image": "pytorch/pytorch", "disk": 40, "env": {"A": "1"}}
    )
    body = RentalSpec.of(op).creation_body(label=LABEL, base_url=None)
    assert body == {
        "image": "pytorch/pytorch",
        "disk": 40,
        "env": {"A": "1"},
        "cancel_unavail": True,
        "label": LABEL,
    }


def test_a_field_rendered_to_a_bad_value_is_refused_before_anything_is_sent():
    op = GpuMarketCreateInstanceOperator(
        task_id="t", offer_filters=FILTERS, image="i", instance={"runtype": "{{ params.runtype }}"}
    )
    op.render_template_fields({"params": {"runtype": "bogus"}})
    with pytest.raises(GpuMarketValidationError, match="^runtype: "):
        RentalSpec.of(op)


def test_operators_differ_by_their_terms_not_by_flags():
    job, create = job_spec().terms, RentalSpec.of(CREATE(task_id="c", **OK, wait_for_running=False)).terms
    assert (job.job, job.waits, job.hands_over, job.lease) == (True, True, False, None)
    assert (create.job, create.waits, create.hands_over, create.lease) == (False, False, True, 6 * 3600)


def test_a_jobs_lease_covers_its_boot_and_run_time_and_is_kept_alive_ahead():
    spec = job_spec(boot_timeout=600, max_runtime=3600, keepalive=900)
    assert spec.lease_seconds == 600 + 3600 + JOB_LEASE_MARGIN_SECONDS
    assert spec.first_lease == 900  # kept alive: the first lease is keepalive, renewed while watched
    assert spec.runtime_deadline(rental()) == 1000.0 + 600 + 3600
    assert RentalSpec.of(CREATE(task_id="c", **OK, lease=7200)).runtime_deadline(rental()) is None


def test_a_job_whose_log_is_not_read_has_its_wrapper_destroy_the_instance_unless_a_result_is_read():
    assert job_spec().stops_on_success() and not job_spec(log_interval=0).stops_on_success()
    reads_result = Terms(job=True, reads_result=True, max_runtime=60)
    assert job_spec(log_interval=0)._replace(terms=reads_result).stops_on_success()


def test_the_watch_waits_for_the_job_unless_its_data_is_still_to_be_staged():
    spec = job_spec(boot_timeout=600, max_runtime=3600)
    watch = spec.watch(rental(), stages_in=False, now=2000.0)
    assert (watch.wait_for, watch.boot_deadline, watch.deadline) == (lifecycle.WAIT_JOB, 1600.0, 5200.0)
    assert watch.running_since is None and watch.hold_bid_up_to is None
    assert spec.watch(rental(), stages_in=True, now=2000.0).wait_for == lifecycle.WAIT_STATUS
    assert spec.watch(rental(staged=True), stages_in=False, now=2000.0).running_since == 2000.0


def test_max_cost_gives_the_watch_the_rates_the_service_bills_from_the_start_of_the_bill():
    watch = job_spec(max_cost=1.0).watch(rental(recorded_at=900.0), stages_in=False, now=2000.0)
    assert (watch.max_cost, watch.cost_rates, watch.compute_from) == (1.0, [900.0, 0.5, 0.0], None)
    assert watch.cost_deadline is None


@pytest.mark.parametrize(
    ("operator", "arguments", "field"),
    [
        (CREATE, {"max_cost": 5}, "max_cost"),  # a created instance's cost is bounded by its lease
        (CREATE, {"command": "x", "outputs": {"/o": "b/o"}, "cloud_integration": "s3"}, "outputs"),
        (
            CREATE,
            {"command": "x", "inputs": {"/i": "b/i"}, "cloud_integration": "s3", "wait_for_running": False},
            "inputs",
        ),
        (GpuMarketRunJobOperator, {"command": "x", "keepalive": 20, "poll_interval": 10}, "keepalive"),
    ],
)
def test_a_rule_that_depends_on_the_operators_terms_names_the_argument(operator, arguments, field):
    with pytest.raises(GpuMarketValidationError, match=f"^{field}"):
        operator(task_id="t", **OK, **arguments)
