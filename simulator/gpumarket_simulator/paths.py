"""The paths the simulated service serves and the limits it enforces, read from the service's published API reference.

Written here rather than imported from the provider: the simulator is a second, independent reading of the
spec, so that a misreading on the client's side shows up as a failing test.
"""

from __future__ import annotations

# The spec's paths (Endpoints). The trailing slash, or its absence, is part of each path.
V0 = "/api/v0"
PATH_SEARCH_OFFERS = f"{V0}/bundles/"
PATH_CREATE_INSTANCE = f"{V0}/asks/{{offer_id}}/"
PATH_INSTANCES = f"{V0}/instances/"
PATH_INSTANCE = f"{V0}/instances/{{instance_id}}/"
PATH_VOLUMES = f"{V0}/volumes"
PATH_ENDPOINTS = f"{V0}/endptjobs"
PATH_REGEN_BACKUP_CODES = f"{V0}/tfa/regen-backup-codes"
PATH_DEPLOYMENTS = f"{V0}/deployments"
PATH_PENDING_PRICE_INCREASES = f"{V0}/instances/pending-price-increases"
PATH_API_KEYS = f"{V0}/auth/apikeys"
PATH_CLOUD_INTEGRATIONS = f"{V0}/users/cloud_integrations"

# Live profile only: paths the live service has beyond the spec (the official CLI calls them).
#: The paged instance list that replaced the v0 one (which answers 410 there).
PATH_INSTANCES_V1 = "/api/v1/instances/"
#: Uploads an instance's log and answers the ``result_url`` to fetch it from.
PATH_REQUEST_LOGS = f"{V0}/instances/request_logs/{{instance_id}}/"
#: Changes an interruptible instance's bid.
PATH_CHANGE_BID = f"{V0}/instances/bid_price/{{instance_id}}/"
PATH_GPU_NAMES = f"{V0}/gpu_names/unique/"
PATH_INSTANCE_FILTERS = f"{V0}/instances/filters/"
PATH_CURRENT_USER = f"{V0}/users/current"
#: The account's charges, one per instance and UTC day, and its invoices (the official CLI's ``show invoices-v1``).
PATH_CHARGES = f"{V0}/charges/"
PATH_INVOICES = "/api/v1/invoices/"

# Both profiles, beyond the spec: the copy endpoints (the official CLI's source shows paths and bodies).
#: PUT starts an instance-to-instance copy; DELETE cancels the copies into ``dst_id``.
PATH_COPY_DIRECT = f"{V0}/commands/copy_direct/"
#: POST starts a copy between an instance and a cloud integration; DELETE cancels the instance's cloud copies.
PATH_RCLONE = f"{V0}/commands/rclone/"

# The spec's limits.
ONSTART_MAX_CHARS = 4048
