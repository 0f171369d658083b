"""The service's paths, enums, statuses and limits, named by every other part of the client.

These are the facts of the spec, and of the live service where it differs.
"""

from __future__ import annotations

# Paths (mind the trailing slashes: they are part of the contract).
API_PREFIX = "/api/v0"
PATH_SEARCH_OFFERS = f"{API_PREFIX}/bundles/"
PATH_CREATE_INSTANCE = f"{API_PREFIX}/asks/{{offer_id}}/"
PATH_INSTANCES = f"{API_PREFIX}/instances/"
PATH_INSTANCE = f"{API_PREFIX}/instances/{{instance_id}}/"
PATH_VOLUMES = f"{API_PREFIX}/volumes"
PATH_ENDPOINTS = f"{API_PREFIX}/endptjobs"
PATH_REGEN_BACKUP_CODES = f"{API_PREFIX}/tfa/regen-backup-codes"
PATH_DEPLOYMENTS = f"{API_PREFIX}/deployments"
PATH_PENDING_PRICE_INCREASES = f"{API_PREFIX}/instances/pending-price-increases"
PATH_API_KEYS = f"{API_PREFIX}/auth/apikeys"
PATH_CLOUD_INTEGRATIONS = f"{API_PREFIX}/users/cloud_integrations"
# Not in the spec; the live service and its official CLI use them (see the README's "live service" section).
API_V1_PREFIX = "/api/v1"
PATH_INSTANCES_V1 = f"{API_V1_PREFIX}/instances/"
#: Asks the service to upload the container's (or the host daemon's) log; answers a ``result_url`` to fetch it from.
PATH_REQUEST_LOGS = f"{API_PREFIX}/instances/request_logs/{{instance_id}}/"
#: Not in the spec: the live service's change of an interruptible instance's bid (what ``vastai change bid`` calls).
PATH_CHANGE_BID = f"{API_PREFIX}/instances/bid_price/{{instance_id}}/"
#: Not in the spec: the live service's instance-to-instance copy (PUT starts one, DELETE cancels those into
#: ``dst_id``), as ``vastai copy`` and ``vastai cancel copy`` call it.
PATH_COPY_DIRECT = f"{API_PREFIX}/commands/copy_direct/"
#: Not in the spec: the live service's copy between an instance and the user's cloud integration (POST starts one,
#: DELETE cancels), as ``vastai cloud copy`` calls it.
PATH_RCLONE = f"{API_PREFIX}/commands/rclone/"
#: Not in the spec: the live service's paged charges (what ``vastai show invoices-v1 --charges`` reads).
PATH_CHARGES = f"{API_PREFIX}/charges/"
#: Not in the spec: the live service's paged invoices (what ``vastai show invoices-v1 --invoices`` reads).
PATH_INVOICES_V1 = f"{API_V1_PREFIX}/invoices/"
#: Not in the spec: the account, with its credit (what ``vastai show user`` reads).
PATH_CURRENT_USER = f"{API_PREFIX}/users/current"

# Enums.
RUNTYPES = ("ssh_direct", "ssh_proxy", "ssh", "jupyter_direct", "jupyter_proxy", "jupyter", "args")
TARGET_STATES = ("running", "stopped")
OFFER_TYPES = ("ondemand", "on-demand", "bid")
#: Offer fields a search filters on: the spec's known ones (gpu_name, num_gpus, gpu_ram, reliability, verified,
#: rentable, direct_port_count) and those the live service's official client filters on. The service ignores any
#: other field, so a misspelt one would match every offer.
OFFER_FILTER_FIELDS = frozenset(
    {
        *("bw_nvlink", "cluster_id", "compute_cap", "cpu_arch", "cpu_cores", "cpu_cores_effective", "cpu_ghz"),
        *("cpu_ram", "cuda_max_good", "datacenter", "direct_port_count", "disk_bw", "disk_space", "dlperf"),
        *("dlperf_per_dphtotal", "dph_total", "driver_version", "duration", "external", "flops_per_dphtotal"),
        *("geolocation", "gpu_arch", "gpu_display_active", "gpu_frac", "gpu_max_power", "gpu_max_temp"),
        *("gpu_mem_bw", "gpu_name", "gpu_ram", "gpu_total_ram", "has_avx", "host_id", "id", "inet_down"),
        *("inet_down_cost", "inet_up", "inet_up_cost", "machine_id", "min_bid", "mobo_name", "num_gpus"),
        *("pci_gen", "pcie_bw", "reliability", "rentable", "rented", "static_ip", "storage_cost", "total_flops"),
        *("ubuntu_version", "verification", "verified", "vms_enabled"),
    }
)
#: Filter operators the spec names; its complete list is "not shown".
FILTER_OPERATORS = ("eq", "gte", "in")
#: The other filter operators the live service's official client sends; any other operator is refused.
CLIENT_FILTER_OPERATORS = ("neq", "gt", "lt", "lte", "notin")
#: Filter operators that take a list of values.
LIST_FILTER_OPERATORS = ("in", "notin")
#: The kind of value a filter compares with, for the filter fields whose type the spec's offer table gives.
OFFER_FILTER_KINDS = {
    **dict.fromkeys(("id", "num_gpus", "gpu_ram", "dph_total", "reliability"), "number"),
    **dict.fromkeys(("direct_port_count", "dlperf_per_dphtotal"), "number"),
    "gpu_name": "string",
    **dict.fromkeys(("verified", "rentable"), "bool"),
}
ORDER_DIRECTIONS = ("asc", "desc")
ENDPOINT_STATES = ("active", "suspended", "stopped")
TFA_METHODS = ("sms", "totp", "email")
TFA_METHODS_NEEDING_SECRET = ("sms", "email")
#: A cloud copy's ``transfer``: which way the files go (the official CLI's exact words).
TRANSFER_TO_CLOUD = "Instance To Cloud"
TRANSFER_FROM_CLOUD = "Cloud To Instance"
TRANSFERS = (TRANSFER_TO_CLOUD, TRANSFER_FROM_CLOUD)
#: What an instance's ``status_msg`` says when a cloud copy ended (the official CLI's words; about 30 s late).
CLOUD_COPY_FINISHED = "Cloud Copy Operation Finished"
#: A charge's ``type``, as the charges list filters on it (the official CLI's choices).
CHARGE_TYPES = ("instance", "volume", "serverless")
#: An invoice's ``service``, as the invoices list filters on it (the values the official CLI sends).
INVOICE_SERVICES = (
    "transfer",
    "stripe_payments",
    "bitpay",
    "coinbase",
    "crypto.com",
    "instance_prepay",
    "paypal_manual",
    "wise_manual",
)
# Instance actual_status values. None means "being provisioned".
STATUS_LOADING = "loading"
STATUS_RUNNING = "running"
STATUS_STOPPED = "stopped"
#: Statuses that, per the spec, never become running: destroy and retry elsewhere.
FAILED_STATUSES = ("exited", "unknown", "offline")
BOOTING_STATUSES = (None, STATUS_LOADING)

# Limits.
ONSTART_MAX_CHARS = 4048
#: An offer's ``storage_cost`` is dollars per GB and month of 30 days, as the official client converts the service's
#: per-second disk rates (``_SEC_PER_MONTH`` in its ``price_increase`` command).
STORAGE_MONTH_HOURS = 30 * 24
#: The disk an instance gets when its create request names none, in GB.
DEFAULT_DISK_GB = 8.0
#: A charge is the service's for one UTC day: its ``day`` is that day's midnight, in epoch seconds.
SECONDS_PER_DAY = 86_400
POLL_INTERVAL_SECONDS = 10
#: Seconds between reads of a running job's log, by default. Each read is one logs request (a PUT, whose live
#: budget is not published; changing an instance is allowed 1/s per key) and one download from storage, so 30 s
#: leaves room for about 30 jobs logging at once per key beside their status reads; rate-limited reads back off.
LOG_INTERVAL_SECONDS = 30.0
#: Seconds to wait for each HTTP response unless the connection says otherwise.
REQUEST_TIMEOUT_SECONDS = 30.0
#: The most charges or invoices one page may hold (the live service's maximum, as the official CLI clamps it).
BILLING_PAGE_LIMIT = 100
#: Characters of an unexpected body quoted in an error message.
BODY_EXCERPT_CHARS = 200


def is_booting(status: str | None) -> bool:
    """True while the instance may still become running (provisioning or loading)."""
    return status in BOOTING_STATUSES


def will_never_run(status: str | None) -> bool:
    """True for statuses that will not become running.

    The spec lists exited, unknown and offline; anything else it does not name (for instance the status after a
    stop, which is "not shown") is treated the same way, so a waiter never hangs on a status it cannot know.
    """
    return not is_booting(status) and status != STATUS_RUNNING


#: Lines asked for when no tail is given (the official client's default).
LOG_TAIL_DEFAULT = 1000
#: Fetching the uploaded log: tries while it is not there yet, seconds between them, seconds per request (as the
#: official client does).
LOG_FETCH_TRIES = 30
LOG_FETCH_INTERVAL_SECONDS = 0.3
LOG_FETCH_TIMEOUT_SECONDS = 10.0
#: The most of one uploaded log that is read; its end is kept.
LOG_MAX_BYTES = 1 << 20
