"""durable=True on Airflow 3.3+: the rental is in the task state store (AIP-103) while it lasts, on a real run."""

from __future__ import annotations

import pytest

from airflow_gpumarket._compat import has_retry_policies

from .conftest import alive, task_states

pytestmark = pytest.mark.skipif(not has_retry_policies(), reason="the task state store is Airflow 3.3+'s")


def test_rule_durable_a_run_saves_its_rental_in_the_task_state_store_and_clears_it_at_the_end(
    example_dag, sim, task_log
):
    from airflow.utils.session import create_session

    run = example_dag("gpm_ui_job").test()
    assert run.state == "success", task_states(run)
    (instance,) = sim.state()["instances"]
    log = task_log()
    assert f"Instance {instance['id']} saved in the task state store (key 'gpumarket_rental')" in log
    assert "The task state store failed" not in log
    from airflow.models.task_state_store import TaskStateStoreModel

    with create_session() as session:
        left = session.query(TaskStateStoreModel.key).filter_by(dag_id=run.dag_id, run_id=run.run_id).all()
    assert left == []  # the rental ended: the store forgot it
    assert alive(sim) == []
