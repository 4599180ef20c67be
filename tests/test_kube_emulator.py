"""Self-tests of tests/kube_emulator.py and tests/kube_operator.py, driven by the real kubernetes client."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import threading
import time

import aiohttp
import aiohttp.web
import kubernetes
import pytest
import requests
from kubernetes.client import ApiException, CoreV1Api, CustomObjectsApi

from tests.harness.kube_emulator import KubeEmulator
from tests.harness.kube_operator import GPU_MESSAGE, HOLD_FINALIZER, FakeKubeRayOperator

RC = ("ray.io", "v1", "default", "rayclusters")


def raycluster(name: str, image: str = "rayproject/ray:2.60.0", workers: int = 0) -> dict:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "labels": {"app": "rayflow"}},
        "spec": {
            "rayVersion": "2.60.0",
            "authOptions": {"mode": "token"},
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "ray-head",
                                "image": image,
                                "ports": [{"name": "dashboard", "containerPort": 8265}],
                            }
                        ]
                    }
                },
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": workers,
                    "minReplicas": workers,
                    "maxReplicas": 4,
                    "template": {"spec": {"containers": [{"name": "ray-worker", "image": image}]}},
                }
            ],
        },
    }


def wait_for(check, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return result


@pytest.fixture
def emu():
    with KubeEmulator(gc_delay_s=0.05) as emulator:
        yield emulator


@pytest.fixture
def api(emu):
    client = kubernetes.config.new_client_from_config(config_file=emu.kubeconfig_path)
    yield CustomObjectsApi(client), CoreV1Api(client)
    client.close()


def apply(custom: CustomObjectsApi, body: dict):
    return custom.patch_namespaced_custom_object(
        *RC,
        body["metadata"]["name"],
        body,
        field_manager="rayflow",
        force=True,
        _content_type="application/apply-patch+yaml",
    )


def test_apply_creates_then_updates_and_prunes(emu, api):
    custom, _ = api
    body = raycluster("rc")
    body["metadata"]["annotations"] = {"drop-me": "1"}
    # The API server answers an apply-create with 201, which kubernetes-python deserializes as None.
    assert apply(custom, body) is None
    created = custom.get_namespaced_custom_object(*RC, "rc")
    assert created["metadata"]["generation"] == 1 and created["metadata"]["uid"]
    seen = [r for r in emu.requests if r.method == "PATCH"][-1]
    assert seen.path == "/apis/ray.io/v1/namespaces/default/rayclusters/rc"
    assert seen.query == {"fieldManager": "rayflow", "force": "True"}
    assert seen.content_type == "application/apply-patch+yaml"

    del body["metadata"]["annotations"]
    body["spec"]["rayVersion"] = "2.61.0"
    updated = apply(custom, body)
    assert updated["spec"]["rayVersion"] == "2.61.0" and "annotations" not in updated["metadata"]
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]
    assert updated["metadata"]["generation"] == 2
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    again = apply(custom, body)  # a no-op apply changes nothing, resourceVersion included
    assert again["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]


def test_merge_and_json_patch(emu, api):
    custom, core = api
    apply(custom, raycluster("rc"))
    patched = custom.patch_namespaced_custom_object(
        *RC, "rc", {"metadata": {"labels": {"app": None, "x": "y"}}}
    )
    assert patched["metadata"]["labels"] == {"x": "y"}
    patched = custom.patch_namespaced_custom_object(
        *RC,
        "rc",
        [{"op": "replace", "path": "/spec/rayVersion", "value": "2.59.0"}],
        _content_type="application/json-patch+json",
    )
    assert patched["spec"]["rayVersion"] == "2.59.0"
    # The status subresource writes status only, and the main resource ignores status.
    custom.patch_namespaced_custom_object_status(
        *RC, "rc", {"status": {"state": "ready"}, "spec": {"suspend": True}}
    )
    custom.patch_namespaced_custom_object(*RC, "rc", {"status": {"state": "failed"}})
    obj = custom.get_namespaced_custom_object(*RC, "rc")
    assert obj["status"] == {"state": "ready"} and "suspend" not in obj["spec"]
    core.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {}})
    with pytest.raises(
        ApiException
    ) as e:  # a JSON patch sent as a dict becomes strategic merge: 415 on CRs
        custom.patch_namespaced_custom_object(
            *RC, "rc", {"a": 1}, _content_type="application/json-patch+json"
        )
    assert e.value.status == 415


def test_selectors(emu, api):
    custom, core = api
    for name, labels in [
        ("a", {"ray.io/node-type": "head", "tier": "x"}),
        ("b", {"ray.io/node-type": "worker"}),
        ("c", {"other": "1"}),
    ]:
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": name, "labels": labels},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        )
    names = lambda **kw: sorted(
        p.metadata.name for p in core.list_namespaced_pod("default", **kw).items
    )
    assert names(label_selector="ray.io/node-type=head") == ["a"]
    assert names(label_selector="ray.io/node-type!=head") == ["b", "c"]
    assert names(label_selector="ray.io/node-type in (head,worker),!other") == ["a", "b"]
    assert names(label_selector="tier,ray.io/node-type") == ["a"]
    assert names(field_selector="metadata.name=b") == ["b"]
    emu.patch("pods", "default", "c", {"status": {"phase": "Running"}})
    assert names(field_selector="status.phase=Running") == ["c"]
    assert names(field_selector="status.phase!=Running,metadata.name!=a") == ["b"]
    with pytest.raises(ApiException) as e:
        core.list_namespaced_pod("default", field_selector="spec.containers=x")
    assert e.value.status == 400


def test_delete_with_and_without_finalizer(emu, api):
    custom, _ = api
    apply(custom, raycluster("plain"))
    custom.delete_namespaced_custom_object(*RC, "plain")
    with pytest.raises(ApiException) as e:
        custom.get_namespaced_custom_object(*RC, "plain")
    assert e.value.status == 404
    with pytest.raises(ApiException) as e:
        custom.delete_namespaced_custom_object(*RC, "plain")
    assert e.value.status == 404

    held = raycluster("held")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    apply(custom, held)
    custom.delete_namespaced_custom_object(*RC, "held")
    obj = custom.get_namespaced_custom_object(*RC, "held")
    assert obj["metadata"]["deletionTimestamp"]
    custom.patch_namespaced_custom_object(*RC, "held", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as e:
        custom.get_namespaced_custom_object(*RC, "held")
    assert e.value.status == 404


def test_unauthenticated_requests_get_401(emu):
    assert requests.get(f"{emu.url}/api/v1/namespaces/default/pods", timeout=5).status_code == 401
    config = kubernetes.client.Configuration(host=emu.url)  # no token
    with pytest.raises(ApiException) as e:
        CoreV1Api(kubernetes.client.ApiClient(config)).list_namespaced_pod("default")
    assert e.value.status == 401


def test_watch_streams_changes(emu, api):
    custom, _ = api
    apply(custom, raycluster("rc"))
    seen = []
    watch = kubernetes.watch.Watch()
    threading.Timer(
        0.2, lambda: emu.patch("rayclusters", "default", "rc", {"status": {"state": "ready"}})
    ).start()
    for event in watch.stream(
        custom.list_namespaced_custom_object, *RC, label_selector="app=rayflow", timeout_seconds=1
    ):
        seen.append((event["type"], event["object"].get("status", {}).get("state")))
        if len(seen) == 2:
            watch.stop()
    assert seen == [("ADDED", None), ("MODIFIED", "ready")]


def test_operator_brings_up_a_cluster_and_gc_follows_deletion(emu, api):
    custom, core = api
    with FakeKubeRayOperator(emu, "http://127.0.0.1:1", "tok3n", head_ready_after_s=0.1):
        apply(custom, raycluster("rc", workers=2))
        obj = wait_for(
            lambda: [
                c
                for c in custom.get_namespaced_custom_object(*RC, "rc")
                .get("status", {})
                .get("conditions", [])
                if c["type"] == "HeadPodReady" and c["status"] == "True"
            ]
        )
        assert obj[0]["reason"] == "HeadPodRunningAndReady"
        assert custom.get_namespaced_custom_object(*RC, "rc")["status"]["state"] == "ready"
        head = core.list_namespaced_pod(
            "default", label_selector="ray.io/cluster=rc,ray.io/node-type=head"
        ).items
        assert (
            len(head) == 1
            and head[0].metadata.name.startswith("rc-head-")
            and len(head[0].metadata.name) == 13
        )
        assert head[0].metadata.labels["ray.io/group"] == "headgroup"
        assert head[0].metadata.owner_references[0].kind == "RayCluster"
        env = {e.name: e for e in head[0].spec.containers[0].env}
        assert env["RAY_AUTH_TOKEN"].value_from.secret_key_ref.to_dict() == {
            "name": "rc",
            "key": "auth_token",
            "optional": None,
        }
        secret = core.read_namespaced_secret("rc", "default")
        assert base64.b64decode(secret.data["auth_token"]).decode() == "tok3n"
        svc = core.read_namespaced_service("rc-head-svc", "default")
        assert {p.name: p.port for p in svc.spec.ports}["dashboard"] == 8265
        assert (
            len(
                core.list_namespaced_pod(
                    "default", label_selector="ray.io/node-type=worker,ray.io/group=gpu"
                ).items
            )
            == 2
        )
        events = core.list_namespaced_event(
            "default", field_selector="involvedObject.name=rc,reason=CreatedHeadPod"
        )
        assert events.items[0].type == "Normal" and events.items[0].event_time is not None

        custom.delete_namespaced_custom_object(*RC, "rc")
        wait_for(
            lambda: (
                not core.list_namespaced_pod("default", label_selector="ray.io/cluster=rc").items
            )
        )
        wait_for(
            lambda: (
                not [
                    s
                    for s in core.list_namespaced_secret("default").items
                    if s.metadata.name == "rc"
                ]
            )
        )
        assert not core.list_namespaced_service("default").items


def _head_status(core: CoreV1Api, name: str = "rc"):
    return core.list_namespaced_pod(
        "default", label_selector=f"ray.io/cluster={name},ray.io/node-type=head"
    ).items[0]


def test_scenario_image_pull(emu, api):
    custom, core = api
    with FakeKubeRayOperator(emu, None, scenario="image_pull", head_ready_after_s=0.05):
        apply(custom, raycluster("rc", image="rayproject/ray:nope"))
        waiting = wait_for(
            lambda: (
                (s := _head_status(core).status.container_statuses)
                and s[0].state.waiting
                and s[0].state.waiting.reason == "ImagePullBackOff"
                and s[0].state.waiting
            )
        )
        assert waiting.message == 'Back-off pulling image "rayproject/ray:nope"'
        head = _head_status(core)
        events = core.list_namespaced_event(
            "default", field_selector=f"involvedObject.uid={head.metadata.uid}"
        ).items
        assert {(e.type, e.reason) for e in events} >= {
            ("Warning", "Failed"),
            ("Normal", "BackOff"),
        }
        assert any("ErrImagePull" in e.message for e in events)
        conditions = custom.get_namespaced_custom_object(*RC, "rc")["status"]["conditions"]
        assert {
            "type": "HeadPodReady",
            "status": "False",
            "reason": "ContainersNotReady",
        }.items() <= [c for c in conditions if c["type"] == "HeadPodReady"][0].items()


@pytest.mark.parametrize("scenario", ["unschedulable", "unschedulable_taint"])
def test_scenario_unschedulable(emu, api, scenario):
    custom, core = api
    with FakeKubeRayOperator(emu, None, scenario=scenario, head_ready_after_s=0.05):
        apply(custom, raycluster("rc"))
        events = wait_for(
            lambda: (
                core.list_namespaced_event(
                    "default",
                    field_selector="reason=FailedScheduling,type=Warning,involvedObject.kind=Pod",
                ).items
            )
        )
        head = _head_status(core)
        assert head.status.phase == "Pending"
        condition = head.status.conditions[0]
        assert (condition.type, condition.status, condition.reason) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        )
        assert condition.message == events[0].message
        if scenario == "unschedulable":
            assert events[0].message == GPU_MESSAGE
        else:
            assert "1 node(s) had untolerated taint {nvidia.com/gpu: present}" in events[0].message
        assert (
            events[0].reporting_component == "default-scheduler"
            and events[0].last_timestamp is None
        )


def test_scenario_invalid_spec(emu, api):
    custom, core = api
    with FakeKubeRayOperator(emu, None, scenario="invalid_spec", head_ready_after_s=0.05):
        apply(custom, raycluster("rc"))
        events = wait_for(
            lambda: (
                core.list_namespaced_event(
                    "default",
                    field_selector="involvedObject.kind=RayCluster,reason=InvalidRayClusterSpec",
                ).items
            )
        )
        assert events[0].type == "Warning"
        assert events[0].message.startswith(
            "The RayCluster spec is invalid default/rc: authOptions.mode is 'token'"
        )
        time.sleep(0.1)
        assert not core.list_namespaced_pod("default").items


@pytest.mark.parametrize("reason,code", [("Error", 1), ("OOMKilled", 137)])
def test_scenario_crash_loop(emu, api, reason, code):
    custom, core = api
    with FakeKubeRayOperator(
        emu, None, scenario="crash_loop", crash_reason=reason, head_ready_after_s=0.05
    ):
        apply(custom, raycluster("rc"))
        status = wait_for(lambda: (s := _head_status(core).status.container_statuses) and s[0])
        assert status.state.waiting.reason == "CrashLoopBackOff" and status.restart_count > 0
        assert (status.last_state.terminated.reason, status.last_state.terminated.exit_code) == (
            reason,
            code,
        )
        events = core.list_namespaced_event(
            "default", field_selector="reason=BackOff,type=Warning"
        ).items
        assert events[0].message.startswith("Back-off restarting failed container ray-head")


def test_scenario_worker_unschedulable_keeps_state_but_head_ready(emu, api):
    custom, _ = api
    with FakeKubeRayOperator(emu, None, scenario="worker_unschedulable", head_ready_after_s=0.05):
        apply(custom, raycluster("rc", workers=1))
        wait_for(
            lambda: any(
                c["type"] == "HeadPodReady" and c["status"] == "True"
                for c in custom.get_namespaced_custom_object(*RC, "rc")
                .get("status", {})
                .get("conditions", [])
            )
        )
        assert "state" not in custom.get_namespaced_custom_object(*RC, "rc")["status"]


def test_scenario_stuck_finalizer(emu, api):
    custom, _ = api
    with FakeKubeRayOperator(emu, None, scenario="stuck_finalizer", head_ready_after_s=0.05):
        apply(custom, raycluster("rc"))
        wait_for(
            lambda: (
                HOLD_FINALIZER
                in custom.get_namespaced_custom_object(*RC, "rc")["metadata"].get("finalizers", [])
            )
        )
        custom.delete_namespaced_custom_object(*RC, "rc")
        time.sleep(0.2)
        assert custom.get_namespaced_custom_object(*RC, "rc")["metadata"]["deletionTimestamp"]


@pytest.fixture
def upstream():
    """A tiny dashboard stand-in: echoes headers, hashes streamed uploads, streams, and a websocket."""
    seen: dict = {}

    async def echo(request):
        seen["headers"] = dict(request.headers)
        return aiohttp.web.json_response({"path": request.path, "query": dict(request.query)})

    async def upload(request):
        digest, size = hashlib.sha256(), 0
        async for chunk in request.content.iter_any():
            digest.update(chunk)
            size += len(chunk)
        return aiohttp.web.json_response({"size": size, "sha256": digest.hexdigest()})

    async def stream(request):
        response = aiohttp.web.StreamResponse()
        await response.prepare(request)
        for i in range(3):
            await response.write(f"line {i}\n".encode())
            await asyncio.sleep(0.01)
        return response

    async def tail(request):
        seen["ws_headers"] = dict(request.headers)
        ws = aiohttp.web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str("log 1")
        async for msg in ws:
            await ws.send_str(f"echo {msg.data}")
            break
        await ws.close()
        return ws

    app = aiohttp.web.Application()
    app.router.add_get("/api/version", echo)
    app.router.add_put("/api/packages/{pkg}", upload)
    app.router.add_get("/stream", stream)
    app.router.add_get("/api/jobs/{id}/logs/tail", tail)
    loop = asyncio.new_event_loop()
    runner = aiohttp.web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}", seen
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_service_proxy(emu, api, upstream):
    custom, core = api
    url, seen = upstream
    base = f"{emu.url}/api/v1/namespaces/default/services/rc-head-svc:dashboard/proxy"
    auth = {"Authorization": f"Bearer {emu.token}"}
    # no service yet
    assert requests.get(f"{base}/api/version", headers=auth, timeout=5).status_code == 404
    with FakeKubeRayOperator(emu, url, "tok", head_ready_after_s=0.3):
        apply(custom, raycluster("rc"))
        wait_for(
            lambda: requests.get(f"{base}/api/version", headers=auth, timeout=5).status_code == 503
        )
        wait_for(
            lambda: requests.get(f"{base}/api/version", headers=auth, timeout=5).status_code == 200
        )
        # The real client's proxy call, then the header handling.
        assert "api/version" in core.connect_get_namespaced_service_proxy_with_path(
            "rc-head-svc:dashboard", "default", "api/version"
        )
        for target in ("rc-head-svc:dashboard", "http:rc-head-svc:8265", "rc-head-svc:8265"):
            r = requests.get(
                f"{emu.url}/api/v1/namespaces/default/services/{target}/proxy/api/version?x=1",
                headers=auth | {"X-Ray-Authorization": "Bearer tok"},
                timeout=5,
            )
            assert r.json() == {"path": "/api/version", "query": {"x": "1"}}
            assert (
                "Authorization" not in seen["headers"]
                and seen["headers"]["X-Ray-Authorization"] == "Bearer tok"
            )

        payload = [
            bytes([i]) * 65536 for i in range(16)
        ]  # a 1 MiB chunked upload, as Ray's package PUT
        r = requests.put(
            f"{base}/api/packages/pkg.zip", data=iter(payload), headers=auth, timeout=5
        )
        assert r.json() == {
            "size": 1 << 20,
            "sha256": hashlib.sha256(b"".join(payload)).hexdigest(),
        }
        with requests.get(f"{base}/stream", headers=auth, stream=True, timeout=5) as r:
            assert list(r.iter_lines()) == [b"line 0", b"line 1", b"line 2"]

        async def websocket():
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(f"{base}/api/jobs/j1/logs/tail", headers=auth) as ws:
                    first = await ws.receive_str()
                    await ws.send_str("hi")
                    return first, await ws.receive_str()

        assert asyncio.run(websocket()) == ("log 1", "echo hi")
        assert "Authorization" not in seen["ws_headers"]


def test_rayjob_flow(emu, api):
    custom, core = api
    jobs = ("ray.io", "v1", "default", "rayjobs")
    spec = raycluster("unused")["spec"]
    with FakeKubeRayOperator(emu, None, head_ready_after_s=0.05) as operator:
        custom.create_namespaced_custom_object(
            *jobs,
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayJob",
                "metadata": {"name": "job"},
                "spec": {
                    "submissionMode": "InteractiveMode",
                    "shutdownAfterJobFinishes": True,
                    "rayClusterSpec": spec,
                },
            },
        )
        status = wait_for(
            lambda: (
                (s := custom.get_namespaced_custom_object(*jobs, "job").get("status", {})).get(
                    "jobDeploymentStatus"
                )
                == "Waiting"
                and s
            )
        )
        cluster = status["rayClusterName"]
        assert cluster.startswith("job-") and custom.get_namespaced_custom_object(*RC, cluster)
        custom.patch_namespaced_custom_object(*jobs, "job", {"spec": {"jobId": "raysubmit_1"}})
        wait_for(
            lambda: (
                custom.get_namespaced_custom_object(*jobs, "job")["status"]["jobDeploymentStatus"]
                == "Running"
            )
        )
        operator.finish_rayjob("job", "SUCCEEDED")
        assert (
            custom.get_namespaced_custom_object(*jobs, "job")["status"]["jobDeploymentStatus"]
            == "Complete"
        )
        wait_for(lambda: not core.list_namespaced_pod("default").items)
        with pytest.raises(ApiException):
            custom.get_namespaced_custom_object(*RC, cluster)


# --- server-side dry run and admission (dryRun=All) ---------------------------------------------------


def dry_apply(custom: CustomObjectsApi, body: dict):
    return custom.patch_namespaced_custom_object(
        *RC,
        body["metadata"]["name"],
        body,
        field_manager="rayflow",
        force=True,
        dry_run="All",
        _content_type="application/apply-patch+yaml",
    )


def test_a_dry_run_apply_answers_with_the_object_and_stores_nothing(emu, api):
    custom, _ = api
    events: list = []
    emu.add_listener(lambda *change: events.append(change))
    before = emu.call(lambda: emu.handler._rv)
    dry_apply(custom, raycluster("rc"))  # a create: 201, which the client reads as None
    answered = custom.create_namespaced_custom_object(*RC, raycluster("made"), dry_run="All")
    assert answered["metadata"]["uid"] and answered["spec"]["rayVersion"] == "2.60.0"
    assert (
        emu.get("rayclusters", "default", "rc") is None
        and emu.get("rayclusters", "default", "made") is None
    )
    assert not events and emu.call(lambda: emu.handler._rv) == before
    assert [r.query.get("dryRun") for r in emu.requests if r.method in ("PATCH", "POST")] == [
        "All",
        "All",
    ]
    # on an existing object: the change is answered, not made, and a later real apply is not pruned by it
    apply(custom, raycluster("rc"))
    changed = raycluster("rc")
    changed["spec"]["rayVersion"] = "2.61.0"
    assert dry_apply(custom, changed)["spec"]["rayVersion"] == "2.61.0"
    assert emu.get("rayclusters", "default", "rc")["spec"]["rayVersion"] == "2.60.0"
    custom.delete_namespaced_custom_object(*RC, "rc", dry_run="All")
    assert emu.get("rayclusters", "default", "rc") is not None


@pytest.mark.parametrize("dry_run", [True, False])
def test_an_invalid_ray_object_is_refused_and_nothing_is_created(emu, api, dry_run):
    custom, _ = api
    body = raycluster("rc")
    body["spec"]["enableInTreeAutoscalling"] = True  # misspelt: the CRD has no such field
    with pytest.raises(ApiException) as err:
        (dry_apply if dry_run else apply)(custom, body)
    assert (
        err.value.status == 422 and "spec.enableInTreeAutoscalling: unknown field" in err.value.body
    )
    assert 'RayCluster.ray.io \\"rc\\" is invalid' in err.value.body
    assert emu.get("rayclusters", "default", "rc") is None


def test_the_cel_rule_and_admission_hooks_speak_in_a_dry_run(emu, api):
    custom, _ = api
    body = raycluster("rc")
    body["spec"]["managedBy"] = "someone-else"  # schema-valid; only the CRD's CEL rule refuses it
    with pytest.raises(ApiException) as err:
        dry_apply(custom, body)
    assert err.value.status == 422 and "the managedBy field value must be either" in err.value.body

    def policy(plural: str, obj: dict) -> None:
        if plural == "rayclusters" and "team" not in obj["metadata"].get("labels", {}):
            from tests.harness.kube_emulator import api_error

            raise api_error(
                403,
                "Forbidden",
                'admission webhook "labels.policy.example" denied the request: label team is required',
            )

    emu.call(emu.handler.admission.append, policy)
    with pytest.raises(ApiException) as err:
        dry_apply(custom, raycluster("rc"))
    assert err.value.status == 403 and "label team is required" in err.value.body
    assert emu.get("rayclusters", "default", "rc") is None
    with pytest.raises(ApiException) as err:
        custom.get_namespaced_custom_object(*RC, "rc", _request_timeout=5)
    assert err.value.status == 404
