"""The Kubernetes API calls backend=kuberay makes, through the official `kubernetes` client.

One `Kube` holds one ApiClient, loaded from a kubeconfig (`backend.kubeconfig`, $KUBECONFIG,
~/.kube/config) or, inside a pod, from its service account. Objects come back as plain dicts
(the API's JSON), so the waiting and diagnosing code reads them the same way everywhere. Every
API error that a user can act on becomes a ClusterError of one line; others keep their traceback.
"""

from __future__ import annotations

import base64
import os
from typing import Any

from rayflow.errors import ClusterError

GROUP, VERSION = "ray.io", "v1"
PLURALS = {"RayCluster": "rayclusters", "RayJob": "rayjobs"}
FIELD_MANAGER = "rayflow"


class Unreachable(ClusterError):
    """No API server answered (or no credentials to ask one with): nothing was refused."""


def in_cluster() -> bool:
    """This process runs in a pod with a service account (rayflow submitted from inside the
    cluster)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.isfile(
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )


class Kube:
    def __init__(self, namespace: str, kubeconfig: str | None = None, context: str | None = None):
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        self.namespace = namespace
        try:
            if (
                kubeconfig is None
                and context is None
                and in_cluster()
                and not os.environ.get("KUBECONFIG")
            ):
                config.load_incluster_config()
                self.api_client = client.ApiClient()
            else:
                path = os.path.expanduser(kubeconfig) if kubeconfig else None
                self.api_client = config.new_client_from_config(config_file=path, context=context)
        except (ConfigException, OSError) as err:  # no kubeconfig, an unknown context
            raise Unreachable(
                f"backend.kubeconfig: no usable Kubernetes credentials: {_first_line(err)}"
            ) from None
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)

    @property
    def configuration(self):
        return self.api_client.configuration

    def _call(
        self,
        what: str,
        fn,
        *args: Any,
        missing_ok: bool = False,
        conflict_ok: bool = False,
        **kwargs: Any,
    ):
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return self.api_client.sanitize_for_serialization(fn(*args, **kwargs))
        except ApiException as err:
            if (err.status == 404 and missing_ok) or (err.status == 409 and conflict_ok):
                return None
            raise ClusterError(
                f"Kubernetes refused to {what}: {err.status} {_api_message(err)}"
            ) from None
        except HTTPError as err:  # unreachable API server, TLS failure
            raise Unreachable(
                f"the Kubernetes API server at {self.configuration.host} did not answer ({what}): "
                f"{_first_line(err)}"
            ) from None

    # --- Ray custom objects -------------------------------------------------------------------

    def apply(self, manifest: dict, dry_run: bool = False) -> dict:
        """Server-side apply: create the object or update the fields rayflow manages. dry_run: the
        API server validates and admits it (`dryRun=All`: schema, CEL rules, admission webhooks,
        quotas) and answers with the object it would store, storing nothing."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        what = (
            f"accept {kind} {self.namespace}/{name} in a server-side dry run (nothing was applied)"
            if dry_run
            else f"apply {kind} {self.namespace}/{name}"
        )
        return self._call(
            what,
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURALS[kind],
            name,
            manifest,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
            **_dry_run(dry_run),
        )

    def create(
        self, manifest: dict, dry_run: bool = False, timeout_s: float | None = None
    ) -> dict | None:
        """Create the object, only if none of its name exists: None when one does (409), so a run
        never overwrites another's object. dry_run: the API server's whole admission (schema, CEL
        rules, webhooks, quotas) answers with the object it would store, storing nothing."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        what = (
            f"accept {kind} {self.namespace}/{name} in a server-side dry run (nothing was applied)"
            if dry_run
            else f"create {kind} {self.namespace}/{name}"
        )
        return self._call(
            what,
            self.custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURALS[kind],
            manifest,
            field_manager=FIELD_MANAGER,
            conflict_ok=True,
            **_dry_run(dry_run),
            **_timeout(timeout_s),
        )

    def get(self, kind: str, name: str) -> dict | None:
        return self._call(
            f"read {kind} {self.namespace}/{name}",
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURALS[kind],
            name,
            missing_ok=True,
        )

    def merge_patch(self, kind: str, name: str, patch: dict) -> dict:
        return self._call(
            f"update {kind} {self.namespace}/{name}",
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURALS[kind],
            name,
            patch,
            _content_type="application/merge-patch+json",
        )

    def delete(self, kind: str, name: str, uid: str | None = None) -> bool:
        """Ask for deletion; False when it was already gone (404 counts as deleted). uid: only that
        object (a precondition the API server checks: one recreated under the name is not it)."""
        from kubernetes import client

        preconditions = client.V1Preconditions(uid=uid) if uid else None
        found = self._call(
            f"delete {kind} {self.namespace}/{name}",
            self.custom.delete_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURALS[kind],
            name,
            body=client.V1DeleteOptions(
                propagation_policy="Background", preconditions=preconditions
            ),
            missing_ok=True,
        )
        return found is not None

    # --- core objects -------------------------------------------------------------------------

    def _core_calls(self, verb: str) -> dict[str, Any]:
        from kubernetes import client

        rbac = client.RbacAuthorizationV1Api(self.api_client)
        return {
            "ServiceAccount": getattr(self.core, f"{verb}_namespaced_service_account"),
            "Role": getattr(rbac, f"{verb}_namespaced_role"),
            "RoleBinding": getattr(rbac, f"{verb}_namespaced_role_binding"),
            "Service": getattr(self.core, f"{verb}_namespaced_service"),
        }

    def read_object(self, kind: str, name: str) -> dict | None:
        """A ServiceAccount, Role, RoleBinding or Service of the namespace; None when there is
        none."""
        return self._call(
            f"read {kind} {self.namespace}/{name}",
            self._core_calls("read")[kind],
            name,
            self.namespace,
            missing_ok=True,
        )

    def create_object(self, obj: dict) -> bool:
        """Create a ServiceAccount, Role or RoleBinding; False when one of the name exists (409
        AlreadyExists: it is left as it is)."""
        create = self._core_calls("create")[obj["kind"]]
        made = self._call(
            f"create {obj['kind']} {self.namespace}/{obj['metadata']['name']}",
            create,
            self.namespace,
            obj,
            field_manager=FIELD_MANAGER,
            conflict_ok=True,
        )
        return made is not None

    def pods(self, label_selector: str) -> list[dict]:
        listed = self._call(
            "list pods",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=label_selector,
        )
        return listed.get("items") or []

    def events(self, involved_name: str) -> list[dict]:
        listed = self._call(
            "list events",
            self.core.list_namespaced_event,
            self.namespace,
            field_selector=f"involvedObject.name={involved_name}",
        )
        return listed.get("items") or []

    def secret_value(self, name: str, key: str) -> str | None:
        """A Secret's value, decoded; None when the Secret or the key is not there (yet)."""
        secret = self._call(
            f"read Secret {self.namespace}/{name}",
            self.core.read_namespaced_secret,
            name,
            self.namespace,
            missing_ok=True,
        )
        data = (secret or {}).get("data") or {}
        return base64.b64decode(data[key]).decode() if key in data else None

    def service_proxy_url(self, service: str, port: str) -> str:
        """The API server's proxy to a service port (by name), as a base URL for HTTP clients."""
        host = self.configuration.host.rstrip("/")
        return f"{host}/api/v1/namespaces/{self.namespace}/services/{service}:{port}/proxy"

    def auth_headers(self) -> dict[str, str]:
        """The headers this client authenticates to the API server with (bearer tokens, also
        those an exec plugin refreshes); client certificates go through the TLS context."""
        headers: dict[str, str] = {}
        self.api_client.update_params_for_auth(headers, [], ["BearerToken"])
        return headers

    def close(self) -> None:
        self.api_client.close()


def _timeout(seconds: float | None) -> dict[str, Any]:
    """The client's per-request timeout, where one is asked for (else its default: none)."""
    return {"_request_timeout": seconds} if seconds else {}


def _dry_run(dry_run: bool) -> dict[str, Any]:
    """The client's dry_run argument: the API server admits the object and stores nothing."""
    return {"dry_run": "All"} if dry_run else {}


def _api_message(err) -> str:
    import json

    try:
        return str(json.loads(err.body).get("message") or err.reason)
    except (TypeError, ValueError, AttributeError):
        return str(err.reason)


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


DRY_RUN_TIMEOUT_S = 10.0


def server_dry_run(manifest: dict, kubeconfig: str | None, context: str | None) -> str:
    """A dry run's word from the API server on `manifest` (a create with `dryRun=All`: schema, CEL
    rules, admission, RBAC of this user), as a note; an API server reached that refuses it raises
    ClusterError (one line, its message). Unreachable, or no credentials: the note says the
    documents were checked offline only, and why."""
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    where = f"{kind} {manifest['metadata']['namespace']}/{name}"
    try:
        kube = Kube(manifest["metadata"]["namespace"], kubeconfig, context)
        try:
            answer = kube.create(manifest, dry_run=True, timeout_s=DRY_RUN_TIMEOUT_S)
            host = kube.configuration.host
        finally:
            kube.close()
    except Unreachable as err:
        return f"not validated by an API server (rayflow's offline checks only): {err}"
    if answer is None:
        return f"the API server at {host} has a {where} already (a run would not create it)"
    return f"the API server at {host} accepts {where} (server-side dry run; nothing was applied)"
