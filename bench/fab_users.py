"""Users and roles of `make ui-test`'s deployment, made in its database through the FAB auth manager.

Reads a JSON object from standard input: user name -> {"password": ..., "roles": {role name: [[action,
resource], ...]}}. A role that does not exist is made, and given the grants listed for it (``can_read`` on
``DAG:<dag_id>`` lets the role read that DAG only); FAB's own roles (Admin, Viewer, ...) are taken as they are.

    python bench/fab_users.py < users.json      # with the deployment's AIRFLOW_* environment
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from airflow.api_fastapi.app import create_app, get_auth_manager

    users = json.load(sys.stdin)
    create_app(apps="all")  # initializes the FAB auth manager: its tables and its own roles
    manager = get_auth_manager()
    with manager.flask_app.app_context():
        sm = manager.security_manager
        for name, spec in users.items():
            roles = []
            for role_name, grants in spec["roles"].items():
                role = sm.find_role(role_name) or sm.add_role(role_name)
                for action, resource in grants:
                    sm.add_permission_to_role(role, sm.create_permission(action, resource))
                roles.append(role)
            if sm.find_user(username=name) is None:
                email = f"{name}@example.test"
                if not sm.add_user(name, name, "user", email, roles, password=spec["password"]):
                    print(f"could not add user {name}", file=sys.stderr)
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
