"""The service's API contract as code, one module per concern; pure functions only (no Airflow, no transport).

- ``paths``: paths, enums, statuses and limits;
- ``validation``: checks of single values (each names the field and the fix);
- ``fields``: request bodies and the creation-field tables they are built from;
- ``responses``: reading answers and mapping error shapes to the provider's exceptions;
- ``listing``: the instance list's paging state machine;
- ``retry``: request budgets, patience and the retry policy.

The names below are the package's surface (``from airflow_gpumarket import api; api.pack_onstart(...)``). A value
meant to be changed at run time (a test's shorter patience) is read, and patched, in its own module.
"""

from __future__ import annotations

from airflow_gpumarket.api.fields import (
    CREATION_FIELD_NAMES,
    CREATION_FIELDS,
    ENDPOINT_FIELD_TABLE,
    ENDPOINT_FIELDS,
    CreationField,
    OfferQuery,
    build_change_bid_body,
    build_create_instance_body,
    build_delete_deployments_body,
    build_endpoint_body,
    build_regen_backup_codes_body,
    build_request_logs_body,
    build_search_body,
    build_volume_listing_body,
    check_creation_field_names,
    log_result_url,
)
from airflow_gpumarket.api.listing import (
    LIST_PAGE_LIMIT,
    MAX_LIST_PAGES,
    InstanceListing,
    falls_back_to_v0,
    find_by_label,
    listing_total,
)
from airflow_gpumarket.api.paths import (
    API_PREFIX,
    API_V1_PREFIX,
    BODY_EXCERPT_CHARS,
    BOOTING_STATUSES,
    ENDPOINT_STATES,
    FAILED_STATUSES,
    FILTER_OPERATORS,
    LOG_FETCH_INTERVAL_SECONDS,
    LOG_FETCH_TIMEOUT_SECONDS,
    LOG_FETCH_TRIES,
    LOG_INTERVAL_SECONDS,
    LOG_MAX_BYTES,
    LOG_TAIL_DEFAULT,
    OFFER_TYPES,
    ONSTART_MAX_CHARS,
    ORDER_DIRECTIONS,
    PATH_API_KEYS,
    PATH_CHANGE_BID,
    PATH_CLOUD_INTEGRATIONS,
    PATH_CREATE_INSTANCE,
    PATH_DEPLOYMENTS,
    PATH_ENDPOINTS,
    PATH_INSTANCE,
    PATH_INSTANCES,
    PATH_INSTANCES_V1,
    PATH_PENDING_PRICE_INCREASES,
    PATH_REGEN_BACKUP_CODES,
    PATH_REQUEST_LOGS,
    PATH_SEARCH_OFFERS,
    PATH_VOLUMES,
    POLL_INTERVAL_SECONDS,
    REQUEST_TIMEOUT_SECONDS,
    RUNTYPES,
    STATUS_LOADING,
    STATUS_RUNNING,
    STATUS_STOPPED,
    TARGET_STATES,
    TFA_METHODS,
    TFA_METHODS_NEEDING_SECRET,
    is_booting,
    will_never_run,
)
from airflow_gpumarket.api.responses import (
    AUTH_ERRORS,
    QUOTA_ERRORS,
    decode_body,
    expect_list,
    is_auth_error,
    parse_rate_limit_reset,
    parse_retry_after,
    raise_for_response,
    redact,
    unwrap_instance,
)
from airflow_gpumarket.api.retry import (
    CHANGE_RATE_PER_SECOND,
    CREATE_RATE_PER_SECOND,
    DESTROY_RATE_PER_SECOND,
    LIST_RATE_PER_SECOND,
    MAX_RETRY_AFTER_SECONDS,
    PATIENT_OPERATIONS,
    RATE_LIMIT_BACKOFF_CAP_SECONDS,
    RATE_LIMIT_PATIENCE_SECONDS,
    READ_RATE_PER_SECOND,
    SEARCH_RATE_PER_SECOND,
    RetryPolicy,
    create_surely_not_processed,
    is_retryable,
    rate_budget,
    retry_wait_seconds,
)
from airflow_gpumarket.api.validation import (
    OPERATOR_NAME,
    drop_none,
    env_variables,
    is_positive_int,
    is_positive_number,
    pack_onstart,
    port_mappings,
    require_bid,
    require_bool,
    require_choice,
    require_image_login,
    require_non_negative_int,
    require_non_negative_number,
    require_positive_int,
    require_positive_number,
    require_string,
    require_text,
    validate_env,
    validate_onstart,
    validate_order,
    validate_volume_info,
)
