"""The KubeRay operator's (and kubelet's, scheduler's) part, played against tests/kube_emulator.py.

It reacts to RayCluster/RayJob writes on the emulator loop and writes what the real components
write: head/worker pods, the auth Secret, the head Service (whose proxy it points at a real Ray
dashboard), RayCluster status conditions, and Events in the shape each component emits them.
KubeRay's controllers use the events.k8s.io recorder, so their Events (and the scheduler's) carry
eventTime/action/reportingComponent and no count/firstTimestamp/lastTimestamp; the kubelet's use
the core recorder (source, count, timestamps, no eventTime). Clients must cope with both.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import secrets
from typing import Any

from tests.harness.kube_emulator import KubeEmulator, _suffix, merge_patch, now_iso

SCENARIOS = (
    "ok",
    "image_pull",
    "unschedulable",
    "unschedulable_taint",
    "worker_unschedulable",
    "invalid_spec",
    "crash_loop",
    "stuck_finalizer",
)
GPU_MESSAGE = (
    "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
    "3 No preemption victims found for incoming pod."
)
TAINT_MESSAGE = (
    "0/1 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}. "
    "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
)
HOLD_FINALIZER = "example.com/hold"
# KubeRay adds these to the head Service when the head container does not name them.
DEFAULT_PORTS = {
    "gcs-server": 6379,
    "dashboard": 8265,
    "client": 10001,
    "metrics": 8080,
    "serve": 8000,
}


def _micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class FakeKubeRayOperator:
    """A context manager; while entered it reconciles every RayCluster and RayJob in the emulator."""

    def __init__(
        self,
        emulator: KubeEmulator,
        dashboard_url: str | None,
        ray_token: str | None = None,
        *,
        scenario: str = "ok",
        head_ready_after_s: float = 1.0,
        crash_reason: str = "Error",
        spec_error: str = "authOptions.mode is 'token' but minimum Ray version is 2.52.0, got 2.9.0",
    ):
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; one of {SCENARIOS}")
        self.emu, self.h = emulator, emulator.handler
        self.dashboard_url, self.ray_token = dashboard_url, ray_token
        self.scenario, self.head_ready_after_s = scenario, head_ready_after_s
        self.crash_reason, self.spec_error = crash_reason, spec_error
        self._seen: dict[str, int] = {}  # RayCluster uid -> the generation reconciled
        self._tasks: set[asyncio.Task] = set()
        self._errors: list[BaseException] = []

    def __enter__(self) -> FakeKubeRayOperator:
        self.emu.add_listener(self._on_change)
        self.emu.call(
            lambda: [
                self._on_change("ADDED", p, None, o)
                for p in ("rayclusters", "rayjobs")
                for o in self.h.list(p, None)
            ]
        )
        return self

    def __exit__(self, *exc_info: Any) -> None:
        def stop() -> None:
            self.h.listeners.remove(self._on_change)
            for task in self._tasks:
                task.cancel()

        self.emu.call(stop)
        if self._errors and exc_info[0] is None:
            raise ExceptionGroup("the fake KubeRay operator failed", self._errors)

    # -- dispatch (on the emulator loop) --------------------------------------------------------
    def _on_change(self, event: str, plural: str, old: dict | None, new: dict | None) -> None:
        if (
            plural == "rayclusters"
            and new is not None
            and not new["metadata"].get("deletionTimestamp")
        ):
            if self._seen.get(new["metadata"]["uid"]) != new["metadata"]["generation"]:
                self._seen[new["metadata"]["uid"]] = new["metadata"]["generation"]
                self._spawn(self._reconcile_cluster(new))
        elif plural == "rayjobs" and new is not None:
            self._spawn(self._reconcile_job(new))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self._errors.append(t.exception())

        task.add_done_callback(done)

    # -- RayCluster -------------------------------------------------------------------------------
    async def _reconcile_cluster(self, rc: dict[str, Any]) -> None:
        ns, name, spec = rc["metadata"]["namespace"], rc["metadata"]["name"], rc.get("spec", {})
        error = self._validate(spec) or (
            self.spec_error if self.scenario == "invalid_spec" else None
        )
        if error:  # KubeRay logs, emits this Warning and stops reconciling: no pods at all
            self.event(
                rc,
                "Warning",
                "InvalidRayClusterSpec",
                f"The RayCluster spec is invalid {ns}/{name}: {error}",
                component="raycluster-controller",
                action="Validate",
            )
            return
        if self.scenario == "stuck_finalizer" and HOLD_FINALIZER not in rc["metadata"].get(
            "finalizers", []
        ):
            self._merge(
                "rayclusters",
                ns,
                name,
                {
                    "metadata": {
                        "finalizers": [*rc["metadata"].get("finalizers", []), HOLD_FINALIZER]
                    }
                },
            )
        owner = [
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayCluster",
                "name": name,
                "uid": rc["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        auth = spec.get("authOptions", {})
        token_secret = auth.get("secretName") or name
        if (
            auth.get("mode") == "token"
            and not auth.get("secretName")
            and not self._get("secrets", ns, name)
        ):
            token = self.ray_token or secrets.token_urlsafe(32)
            self.h.create(
                "secrets",
                ns,
                {
                    "metadata": {
                        "name": name,
                        "ownerReferences": owner,
                        "labels": {"ray.io/cluster": name},
                    },
                    "type": "Opaque",
                    "data": {"auth_token": base64.b64encode(token.encode()).decode()},
                },
            )
        head_template = spec["headGroupSpec"]["template"]
        head_labels = {
            "ray.io/cluster": name,
            "ray.io/node-type": "head",
            "ray.io/group": "headgroup",
        }
        head = self.h.list("pods", ns, f"ray.io/cluster={name},ray.io/node-type=head")
        if not head:
            pod_spec = copy.deepcopy(head_template.get("spec", {}))
            container = pod_spec["containers"][0]
            container.setdefault("name", "ray-head")
            if auth.get("mode") == "token":
                container.setdefault("env", []).extend(
                    [
                        {"name": "RAY_AUTH_MODE", "value": "token"},
                        {
                            "name": "RAY_AUTH_TOKEN",
                            "valueFrom": {
                                "secretKeyRef": {"name": token_secret, "key": "auth_token"}
                            },
                        },
                    ]
                )
            named = {p.get("name") for p in container.get("ports", [])}
            container.setdefault("ports", []).extend(
                {"name": n, "containerPort": p} for n, p in DEFAULT_PORTS.items() if n not in named
            )
            head = [self._create_pod(rc, f"{name}-head-{_suffix()}", head_labels, pod_spec, owner)]
            self.event(
                rc,
                "Normal",
                "CreatedHeadPod",
                f"Created head Pod {ns}/{head[0]['metadata']['name']}",
                component="raycluster-controller",
                action="Create",
            )
        for group in spec.get("workerGroupSpecs", []):
            labels = {
                "ray.io/cluster": name,
                "ray.io/node-type": "worker",
                "ray.io/group": group["groupName"],
            }
            have = self.h.list("pods", ns, ",".join(f"{k}={v}" for k, v in labels.items()))
            wanted = group.get("replicas", group.get("minReplicas", 0))
            for _ in range(len(have), wanted):
                pod = self._create_pod(
                    rc,
                    f"{name}-{group['groupName']}-worker-{_suffix()}",
                    labels,
                    copy.deepcopy(group["template"].get("spec", {})),
                    owner,
                )
                self.event(
                    rc,
                    "Normal",
                    "CreatedWorkerPod",
                    f"Created worker Pod {ns}/{pod['metadata']['name']}",
                    component="raycluster-controller",
                    action="Create",
                )
        svc_name = f"{name}-head-svc"
        if not self._get("services", ns, svc_name):
            ports = [
                {
                    "name": p["name"],
                    "port": p["containerPort"],
                    "protocol": "TCP",
                    "appProtocol": "tcp",
                    "targetPort": p["containerPort"],
                }
                for p in head[0]["spec"]["containers"][0]["ports"]
            ]
            self.h.create(
                "services",
                ns,
                {
                    "metadata": {
                        "name": svc_name,
                        "labels": head_labels | {"ray.io/identifier": f"{name}-head"},
                        "ownerReferences": owner,
                    },
                    "spec": {
                        "clusterIP": "None",
                        "type": "ClusterIP",
                        "ports": ports,
                        "selector": {"ray.io/cluster": name, "ray.io/node-type": "head"},
                    },
                },
            )
            self.event(
                rc,
                "Normal",
                "CreatedService",
                f"Created service {ns}/{svc_name}",
                component="raycluster-controller",
                action="Create",
            )
            if self.dashboard_url:
                self.h.upstreams[ns, svc_name, None] = self.dashboard_url
        self._cluster_status(ns, name)
        await self._bring_up(rc, head[0])

    def _validate(self, spec: dict[str, Any]) -> str | None:
        """A few of KubeRay's ValidateRayClusterSpec rules, with its messages."""
        if not spec.get("headGroupSpec", {}).get("template", {}).get("spec", {}).get("containers"):
            return "headGroupSpec should have at least one container"
        for group in spec.get("workerGroupSpecs", []):
            lo, hi = group.get("minReplicas"), group.get("maxReplicas")
            if lo is not None and hi is not None and lo > hi:
                return f"worker group {group['groupName']} has minReplicas {lo} greater than maxReplicas {hi}"
        if spec.get("authOptions", {}).get("mode") == "token" and not spec.get("rayVersion"):
            return (
                "authOptions.mode is 'token' but RayVersion was not specified. "
                "Ray version 2.52.0 or later is required"
            )
        return None

    def _create_pod(
        self, rc: dict, name: str, labels: dict, spec: dict, owner: list
    ) -> dict[str, Any]:
        spec.setdefault("restartPolicy", "Always")
        return self.h.create(
            "pods",
            rc["metadata"]["namespace"],
            {
                "metadata": {"name": name, "labels": labels, "ownerReferences": owner},
                "spec": spec,
                "status": {"phase": "Pending", "qosClass": "Burstable"},
            },
        )

    async def _bring_up(self, rc: dict[str, Any], head: dict[str, Any]) -> None:
        """What the scheduler and kubelet do to the pods, per scenario, after head_ready_after_s."""
        ns, name = rc["metadata"]["namespace"], rc["metadata"]["name"]
        await asyncio.sleep(self.head_ready_after_s)
        pods = self.h.list("pods", ns, f"ray.io/cluster={name}")
        for pod in pods:
            is_head = pod["metadata"]["labels"]["ray.io/node-type"] == "head"
            if (
                self.scenario in ("unschedulable", "unschedulable_taint")
                and is_head
                or (self.scenario == "worker_unschedulable" and not is_head)
            ):
                self._unschedulable(
                    pod, TAINT_MESSAGE if self.scenario == "unschedulable_taint" else GPU_MESSAGE
                )
            elif self.scenario == "image_pull" and is_head:
                await self._image_pull(pod)
            elif self.scenario == "crash_loop" and is_head:
                self._crash_loop(pod)
            else:
                self._run(pod)
        self._cluster_status(ns, name)

    def _scheduled(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.event(
            pod,
            "Normal",
            "Scheduled",
            f"Successfully assigned {pod['metadata']['namespace']}/"
            f"{pod['metadata']['name']} to node-1",
            component="default-scheduler",
            action="Binding",
        )
        return {
            "spec": {"nodeName": "node-1"},
            "status": {
                "hostIP": "10.0.0.1",
                "startTime": now_iso(),
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_iso()}
                ],
            },
        }

    def _container_status(
        self, pod: dict, ready: bool, state: dict, **extra: Any
    ) -> list[dict[str, Any]]:
        c = pod["spec"]["containers"][0]
        return [
            {
                "name": c.get("name", "ray-head"),
                "image": c.get("image", ""),
                "imageID": "",
                "ready": ready,
                "started": ready,
                "restartCount": 0,
                "state": state,
                "lastState": {},
            }
            | extra
        ]

    def _not_ready(self, pod: dict, reason: str, message: str) -> list[dict[str, Any]]:
        return [
            {
                "type": t,
                "status": "False",
                "reason": reason,
                "message": message,
                "lastTransitionTime": now_iso(),
            }
            for t in ("Ready", "ContainersReady")
        ]

    def _run(self, pod: dict[str, Any]) -> None:
        patch = self._scheduled(pod)
        c = pod["spec"]["containers"][0]
        for reason, message in (
            ("Pulled", f'Container image "{c.get("image")}" already present on machine'),
            ("Created", f"Created container {c.get('name')}"),
            ("Started", f"Started container {c.get('name')}"),
        ):
            self.event(
                pod,
                "Normal",
                reason,
                message,
                component="kubelet",
                field_path="spec.containers{%s}" % c.get("name"),
            )
        patch["status"] |= {
            "phase": "Running",
            "podIP": f"10.244.0.{secrets.randbelow(200) + 2}",
            "containerStatuses": self._container_status(
                pod, True, {"running": {"startedAt": now_iso()}}
            ),
        }
        patch["status"]["conditions"] += [
            {"type": t, "status": "True", "lastTransitionTime": now_iso()}
            for t in ("Initialized", "ContainersReady", "Ready")
        ]
        self._merge("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], patch)

    def _unschedulable(self, pod: dict[str, Any], message: str) -> None:
        self.event(
            pod,
            "Warning",
            "FailedScheduling",
            message,
            component="default-scheduler",
            action="Scheduling",
        )
        self._merge(
            "pods",
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            {
                "status": {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": message,
                            "lastTransitionTime": now_iso(),
                        }
                    ],
                }
            },
        )

    async def _image_pull(self, pod: dict[str, Any]) -> None:
        ns, name, c = (
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            pod["spec"]["containers"][0],
        )
        image, where = c.get("image", ""), "spec.containers{%s}" % c.get("name")
        pulled = (
            f'failed to pull and unpack image "docker.io/{image}": failed to resolve reference '
            f'"docker.io/{image}": docker.io/{image}: not found'
        )
        self.event(
            pod,
            "Normal",
            "Pulling",
            f'Pulling image "{image}"',
            component="kubelet",
            field_path=where,
        )
        self.event(
            pod,
            "Warning",
            "Failed",
            f'Failed to pull image "{image}": {pulled}',
            component="kubelet",
            field_path=where,
        )
        self.event(
            pod, "Warning", "Failed", "Error: ErrImagePull", component="kubelet", field_path=where
        )
        patch = self._scheduled(pod)
        patch["status"] |= {
            "phase": "Pending",
            "containerStatuses": self._container_status(
                pod, False, {"waiting": {"reason": "ErrImagePull", "message": pulled}}
            ),
        }
        patch["status"]["conditions"] += self._not_ready(
            pod, "ContainersNotReady", f"containers with unready status: [{c.get('name')}]"
        )
        self._merge("pods", ns, name, patch)
        await asyncio.sleep(min(self.head_ready_after_s, 0.2))
        backoff = f'Back-off pulling image "{image}"'
        # kubelet: Normal
        self.event(pod, "Normal", "BackOff", backoff, component="kubelet", field_path=where)
        self.event(
            pod,
            "Warning",
            "Failed",
            "Error: ImagePullBackOff",
            component="kubelet",
            field_path=where,
        )
        self._merge(
            "pods",
            ns,
            name,
            {
                "status": {
                    "containerStatuses": self._container_status(
                        pod, False, {"waiting": {"reason": "ImagePullBackOff", "message": backoff}}
                    )
                }
            },
        )

    def _crash_loop(self, pod: dict[str, Any]) -> None:
        ns, name, c = (
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            pod["spec"]["containers"][0],
        )
        oom = self.crash_reason == "OOMKilled"
        terminated = {
            "reason": self.crash_reason,
            "exitCode": 137 if oom else 1,
            "startedAt": now_iso(),
            "finishedAt": now_iso(),
            "containerID": f"containerd://{secrets.token_hex(32)}",
        }
        # OOM kills leave no termination message; a failing `ray start` leaves its log tail
        if not oom:
            terminated["message"] = (
                "ValueError: Failed to start the GCS server: address already in use"
            )
        where = "spec.containers{%s}" % c.get("name")
        self.event(
            pod,
            "Warning",
            "BackOff",
            f"Back-off restarting failed container {c.get('name')} in pod "
            f"{name}_{ns}({pod['metadata']['uid']})",
            component="kubelet",
            field_path=where,
            count=3,
        )
        patch = self._scheduled(pod)
        patch["status"] |= {
            "phase": "Running",
            "podIP": "10.244.0.9",
            "containerStatuses": self._container_status(
                pod,
                False,
                {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off 40s restarting failed "
                        f"container={c.get('name')} pod={name}_{ns}({pod['metadata']['uid']})",
                    }
                },
                restartCount=3,
                lastState={"terminated": terminated},
            ),
        }
        patch["status"]["conditions"] += self._not_ready(
            pod, "ContainersNotReady", f"containers with unready status: [{c.get('name')}]"
        )
        self._merge("pods", ns, name, patch)

    def _cluster_status(self, ns: str, name: str) -> None:
        """KubeRay's status: HeadPodReady follows the head pod; state is ready only when every pod is."""
        rc = self._get("rayclusters", ns, name)
        if rc is None:
            return
        pods = self.h.list("pods", ns, f"ray.io/cluster={name}")
        ready = {
            p["metadata"]["name"]
            for p in pods
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
        }
        head = next(
            (p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "head"), None
        )
        workers = [p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker"]
        old = {c["type"]: c for c in rc.get("status", {}).get("conditions", [])}

        def condition(kind: str, ok: bool, reason: str, message: str = "") -> dict[str, Any]:
            status = "True" if ok else "False"
            since = (
                old[kind]["lastTransitionTime"]
                if kind in old and old[kind]["status"] == status
                else now_iso()
            )
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": since,
            }

        head_ready = head is not None and head["metadata"]["name"] in ready
        if head_ready:
            head_condition = condition("HeadPodReady", True, "HeadPodRunningAndReady")
        elif head is None:
            head_condition = condition("HeadPodReady", False, "HeadPodNotFound")
        else:
            pod_ready = next(
                (c for c in head.get("status", {}).get("conditions", []) if c["type"] == "Ready"),
                {},
            )
            head_condition = condition(
                "HeadPodReady",
                False,
                pod_ready.get("reason", "Unknown"),
                pod_ready.get("message", ""),
            )
        all_ready = head_ready and len(ready) == len(pods)
        provisioned = all_ready or old.get("RayClusterProvisioned", {}).get("status") == "True"
        status: dict[str, Any] = {
            "conditions": [
                condition(
                    "RayClusterProvisioned",
                    provisioned,
                    "AllPodRunningAndReadyFirstTime"
                    if provisioned
                    else "RayClusterPodsProvisioning",
                ),
                head_condition,
            ],
            "desiredWorkerReplicas": len(workers),
            "readyWorkerReplicas": len(ready & {w["metadata"]["name"] for w in workers}),
            "availableWorkerReplicas": len(ready & {w["metadata"]["name"] for w in workers}),
            "observedGeneration": rc["metadata"]["generation"],
            "endpoints": {
                p["name"]: str(p["containerPort"])
                for p in (head or {"spec": {"containers": [{}]}})["spec"]["containers"][0].get(
                    "ports", []
                )
            },
            "head": {
                "podName": head["metadata"]["name"],
                "podIP": head.get("status", {}).get("podIP", ""),
                "serviceName": f"{name}-head-svc",
            }
            if head
            else {},
        }
        if all_ready:
            status |= {"state": "ready", "stateTransitionTimes": {"ready": now_iso()}}
        elif "state" in rc.get("status", {}):
            status["state"] = rc["status"][
                "state"
            ]  # KubeRay never moves a cluster back out of ready
        self._merge("rayclusters", ns, name, {"status": status})
        for owner in rc["metadata"].get("ownerReferences", []):
            if owner["kind"] == "RayJob" and head_ready:
                job = self._get("rayjobs", ns, owner["name"])
                if job and job.get("status", {}).get("jobDeploymentStatus") == "Initializing":
                    self._spawn(self._reconcile_job(job))

    # -- RayJob (InteractiveMode) ---------------------------------------------------------------
    async def _reconcile_job(self, job: dict[str, Any]) -> None:
        ns, name, spec = job["metadata"]["namespace"], job["metadata"]["name"], job.get("spec", {})
        status = job.get("status", {})
        deployment = status.get("jobDeploymentStatus")
        if job["metadata"].get("deletionTimestamp"):
            return
        if deployment is None:
            cluster = f"{name}-{_suffix()}"
            self.h.create(
                "rayclusters",
                ns,
                {
                    "metadata": {
                        "name": cluster,
                        "labels": {
                            "ray.io/originated-from-crd": "RayJob",
                            "ray.io/originated-from-cr-name": name,
                        },
                        "ownerReferences": [
                            {
                                "apiVersion": "ray.io/v1",
                                "kind": "RayJob",
                                "name": name,
                                "controller": True,
                                "uid": job["metadata"]["uid"],
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "spec": copy.deepcopy(spec["rayClusterSpec"]),
                },
            )
            self._merge(
                "rayjobs",
                ns,
                name,
                {
                    "status": {
                        "rayClusterName": cluster,
                        "jobDeploymentStatus": "Initializing",
                        "startTime": now_iso(),
                        "observedGeneration": 1,
                    }
                },
            )
        elif deployment == "Initializing":
            rc = self._get("rayclusters", ns, status["rayClusterName"])
            conditions = (rc or {}).get("status", {}).get("conditions", [])
            if any(c["type"] == "HeadPodReady" and c["status"] == "True" for c in conditions):
                self._merge(
                    "rayjobs",
                    ns,
                    name,
                    {
                        "status": {
                            "jobDeploymentStatus": "Waiting",
                            "dashboardURL": f"{status['rayClusterName']}-head-svc.{ns}.svc.cluster.local:8265",
                        }
                    },
                )
        elif deployment == "Waiting" and spec.get("jobId"):
            self._merge(
                "rayjobs",
                ns,
                name,
                {
                    "status": {
                        "jobDeploymentStatus": "Running",
                        "jobId": spec["jobId"],
                        "jobStatus": "RUNNING",
                    }
                },
            )

    def finish_rayjob(
        self, name: str, job_status: str = "SUCCEEDED", namespace: str = "default"
    ) -> None:
        """The submitted Ray job ended (as the operator learns by polling the dashboard)."""

        def finish() -> None:
            job = self.h.read("rayjobs", namespace, name)
            deployment = "Complete" if job_status == "SUCCEEDED" else "Failed"
            self._merge(
                "rayjobs",
                namespace,
                name,
                {
                    "status": {
                        "jobStatus": job_status,
                        "endTime": now_iso(),
                        "jobDeploymentStatus": deployment,
                    }
                },
            )
            if job["spec"].get("shutdownAfterJobFinishes"):
                self.h.delete("rayclusters", namespace, job["status"]["rayClusterName"])

        self.emu.call(finish)

    # -- helpers ----------------------------------------------------------------------------------
    def _get(self, plural: str, ns: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.h.store.get((plural, ns, name)))

    def _merge(self, plural: str, ns: str, name: str, patch: dict[str, Any]) -> None:
        """A controller's write (status included: controllers write both endpoints)."""
        old = self.h.store.get((plural, ns, name))
        if old is not None:
            self.h._commit(plural, ns, name, old, merge_patch(copy.deepcopy(old), patch))

    def event(
        self,
        about: dict[str, Any],
        type_: str,
        reason: str,
        message: str,
        *,
        component: str,
        action: str | None = None,
        field_path: str | None = None,
        count: int = 1,
    ) -> dict[str, Any]:
        """An Event as the component writes it: the kubelet's core recorder, or events.k8s.io for the rest."""
        meta = about["metadata"]
        involved = {
            "apiVersion": about["apiVersion"],
            "kind": about["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta.get("resourceVersion"),
        }
        if field_path:
            involved["fieldPath"] = field_path
        body: dict[str, Any] = {
            "metadata": {
                "name": f"{meta['name']}.{secrets.token_hex(8)}",
                "namespace": meta["namespace"],
            },
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": type_,
        }
        if component == "kubelet":
            body |= {
                "source": {"component": "kubelet", "host": "node-1"},
                "count": count,
                "firstTimestamp": now_iso(),
                "lastTimestamp": now_iso(),
                "eventTime": None,
                "reportingComponent": "kubelet",
                "reportingInstance": "node-1",
            }
        else:
            body |= {
                "source": {},
                "eventTime": _micro_now(),
                "firstTimestamp": None,
                "lastTimestamp": None,
                "action": action,
                "reportingComponent": component,
                "reportingInstance": f"{component}-7d4b9c",
            }
        return self.h.create("events", meta["namespace"], body)
