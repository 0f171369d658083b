"""The bad-input rule every operator's test file checks on its own table of (operator, arguments, field) cases."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from airflow_gpumarket.exceptions import GpuMarketValidationError


def refused_at_parse_time(cases: Sequence[tuple[type, dict[str, Any], str]]) -> Callable[..., None]:
    """The test for ``cases``: each is refused when the DAG is parsed, naming the argument, with nothing sent."""

    @pytest.mark.parametrize(
        ("operator", "arguments", "field"),
        cases,
        ids=[f"{op.__name__.removeprefix('GpuMarket')}-{field}-{i}" for i, (op, _, field) in enumerate(cases)],
    )
    def test_bad_input_is_refused_at_parse_time_naming_the_argument(operator, arguments, field, requests_mock):
        with pytest.raises(GpuMarketValidationError) as caught:
            operator(task_id="t", **arguments)
        # The message starts with the argument, or a part of it such as env['EPOCHS'] or volume_info.volume_id.
        assert caught.value.field.startswith(field), str(caught.value)
        assert str(caught.value).startswith(caught.value.field + ": ")
        assert isinstance(caught.value, ValueError)
        assert requests_mock.call_count == 0

    return test_bad_input_is_refused_at_parse_time_naming_the_argument
