"""backend=kuberay's ownership rows (issues 30 and 43) on the real stack (tests/harness/kube_local.py):
a run joins, reaches and deletes only what is provably this user's, and what another party made
first under rayflow's names gets nothing.

"Nothing reached it" is asserted on the real API server's audit log (scripts/kube_local/audit.py):
every request rayflow's clients made since a mark, the dashboard's (the service proxy's) among
them. Objects another party made are created with kubectl; those no test needs running are
suspended (`spec.suspend`: the real operator makes no pod for them). Another user is another
cache ($XDG_CACHE_HOME: their own key and kept-cluster registry).
"""

from __future__ import annotations

import copy

import pytest

from rayflow.testing.processes import wait_until

KEEP = ("backend.keep_cluster=true", "backend.autostop_idle_minutes=0")
K8S_AUTH = ["+backend.overrides.spec.authOptions.enableK8sTokenAuth=true"]
# a head no Node may hold: the scheduler's FailedScheduling ends the run within its grace
NOWHERE = [
    "+backend.overrides.spec.headGroupSpec.template.spec.nodeSelector.nowhere=yes",
    "backend.schedule_grace_s=1",
]


@pytest.fixture(autouse=True)
def this_user(local_kube, tmp_path_factory, monkeypatch):
    """This user's cache, the stack's environment (token auth, the S3 server)."""
    for key, value in local_kube.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(_cache(tmp_path_factory, "this-user")))


def _cache(factory, who: str):
    return factory.getbasetemp() / "kuberay-users" / who


def backend(stack, *more: str):
    from rayflow.backends import backend_for
    from rayflow.orchestrator.compose import compose_config

    return backend_for(compose_config(*stack.backend("backend.start_timeout_s=90", *more)))


def running(b):
    from rayflow.orchestrator.cluster import running as cluster_running

    return cluster_running(b)


def refused(stack, *more: str, error=None):
    """The one-line error a start with these overrides ends in."""
    from rayflow.errors import ConfigError

    with pytest.raises(error or ConfigError) as raised:
        running(backend(stack, *more)).__enter__()
    assert "\n" not in str(raised.value)
    return raised.value


def reached(stack, mark: int) -> list[str]:
    """What of rayflow's reached a dashboard (the service proxy), a Secret, or wrote, since `mark`."""
    return [
        f"{e['verb']} {e['requestURI']}"
        for e in stack.asked_since(mark)
        if "/proxy" in e["requestURI"]
        or "/secrets/" in e["requestURI"]
        or e["verb"] in ("delete", "deletecollection", "patch", "update")
    ]


def suspended(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    obj["spec"]["suspend"] = True
    return obj


def gone(stack, kind: str, name: str) -> None:
    stack.kube.kubectl("delete", kind, name, "--ignore-not-found", "--wait=false")
    assert wait_until(lambda: not stack.left(name), timeout=60), stack.left(name)


def meta(stack, kind: str, name: str) -> list:
    found = stack.get(kind, name)["metadata"]
    return [found.get(k) for k in ("uid", "labels", "annotations", "deletionTimestamp")]


# --- a cluster kept by a run of another user's, then of this user's ------------------------------


@pytest.fixture(scope="module")
def kept(local_kube, tmp_path_factory):
    """RayCluster default/rayflow (the default name: where users collide), kept by a real run of
    the user whose cache is `owner`; the module's tests delete it."""
    owner = _cache(tmp_path_factory, "this-user")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in local_kube.env().items():
            patch.setenv(key, value)
        patch.setenv("XDG_CACHE_HOME", str(owner))
        with running(backend(local_kube, *KEEP)) as keeper:
            pass
    yield keeper
    gone(local_kube, "raycluster", "rayflow")


def test_another_users_kept_raycluster_of_your_name_is_never_joined(
    kept, local_kube, tmp_path_factory, monkeypatch
):
    """Another user kept a RayCluster under the name yours would have, labelled and annotated as
    rayflow makes them. A run of yours, keeping its cluster or not, refuses it in one line naming
    backend.cluster_name: nothing of the run, no job, no Secret read, reaches its dashboard, and
    it is untouched."""
    stack = local_kube
    monkeypatch.setenv("XDG_CACHE_HOME", str(_cache(tmp_path_factory, "another-user")))
    before, mark = meta(stack, "raycluster", "rayflow"), stack.mark()
    for keep in ((), KEEP):
        error = refused(stack, *keep)
        assert error.key == "backend.cluster_name"
        assert "RayCluster default/rayflow already exists and no run of yours made and kept it" in (
            str(error)
        )
    assert reached(stack, mark) == []
    assert meta(stack, "raycluster", "rayflow") == before


def test_a_kept_cluster_is_joined_by_name_and_never_deleted_by_the_joiner(kept, local_kube):
    """A run of this user's that names the cluster their run kept, and keeps it too, joins it and
    leaves it running; a run with keep_cluster=false, which would delete it, is refused; the kept
    cluster's record stays its first run's."""
    from rayflow.backends import kept as registry

    stack = local_kube
    labels = stack.get("raycluster", "rayflow")["metadata"]["labels"]
    assert labels["rayflow.io/keep"] == "true" and labels["rayflow.io/run"] == kept.owner_run
    error = refused(stack)
    assert error.key == "backend.cluster_name" and "is a cluster you kept" in str(error)
    with running(backend(stack, *KEEP)) as joiner:
        assert joiner.joined and joiner.owner_run == kept.owner_run
        assert joiner.address.startswith("http://127.0.0.1:")
    assert stack.get("raycluster", "rayflow")["metadata"]["labels"] == labels
    [record] = registry.records()
    assert (record.backend, record.name, record.owner_run) == ("kuberay", "rayflow", kept.owner_run)


def test_a_kept_cluster_tampered_with_or_made_again_is_not_joined_reached_or_deleted(
    kept, local_kube, tmp_path
):
    """This user's kept RayCluster, its proof removed (someone with patch rights): `status`
    cannot reach it, `down` leaves it, a run refuses it. Deleted behind rayflow's back and made
    again by someone else with its name, labels and annotations copied: a run refuses it, `down`
    leaves it, `status` says yours is gone, once."""
    import rayflow
    from rayflow.errors import ClusterError

    stack = local_kube
    mine = stack.get("raycluster", "rayflow")
    stack.kube.kubectl("annotate", "raycluster", "rayflow", "rayflow.io/owner-proof-")
    mark = stack.mark()
    [row] = rayflow.clusters()
    assert row.state == "unreachable" and "not rayflow's proof that your run made it" in row.detail
    with pytest.raises(ClusterError, match="rayflow neither reaches nor deletes it"):
        rayflow.down("rayflow")
    assert "has the uid you kept but not rayflow's proof" in str(refused(stack, *KEEP))
    assert reached(stack, mark) == []

    stack.kube.kubectl("delete", "raycluster", "rayflow", "--wait=false")
    # gone from the API at once (its pods go after it, collected by the garbage collector)
    mine_uid = mine["metadata"]["uid"]
    assert wait_until(
        lambda: all(c["metadata"]["uid"] != mine_uid for c in stack.get("rayclusters")["items"]),
        timeout=60,
    )
    copied = suspended(mine)
    copied["metadata"] = {k: mine["metadata"][k] for k in ("name", "namespace", "labels")}
    copied["metadata"]["annotations"] = {
        k: v for k, v in mine["metadata"]["annotations"].items() if k.startswith("rayflow.io/")
    }
    again = stack.put(copied, tmp_path)
    assert again["metadata"]["uid"] != mine["metadata"]["uid"]
    mark = stack.mark()
    error = refused(stack, *KEEP)
    assert error.key == "backend.cluster_name"
    assert "is not the cluster you kept: yours is gone, and this one was made since" in str(error)
    with pytest.raises(ClusterError, match="is not the cluster you kept"):
        rayflow.down("rayflow")
    assert [(r.name, r.state) for r in rayflow.clusters()] == [("rayflow", "gone")]
    assert rayflow.clusters() == []
    assert reached(stack, mark) == []
    assert stack.get("raycluster", "rayflow")["metadata"]["uid"] == again["metadata"]["uid"]


# --- what another party made first under the run's names ------------------------------------------


def test_two_runs_with_one_cluster_name_leave_each_other_intact(local_kube, tmp_path):
    """A RayCluster of another rayflow run (its label) under the name: refused in one line naming
    backend.cluster_name, and left as it was."""
    stack, name = local_kube, "one-name"
    theirs = backend(stack, f"backend.cluster_name={name}").manifest({"rayflow.io/run": "run-a"})
    stack.put(suspended(theirs), tmp_path)
    try:
        before = meta(stack, "raycluster", name)
        error = refused(stack, f"backend.cluster_name={name}")
        assert error.key == "backend.cluster_name"
        assert (
            f"RayCluster default/{name} belongs to another rayflow run (rayflow.io/run=run-a)"
            in str(error)
        )
        assert meta(stack, "raycluster", name) == before
    finally:
        gone(stack, "raycluster", name)


def test_a_run_that_loses_the_race_to_create_refuses_and_deletes_nothing(
    local_kube, tmp_path, monkeypatch, capsys
):
    """Both runs saw no cluster: the API server's create is atomic (409 for the second), and the
    teardown the loser registered before its create leaves the winner's cluster alone."""
    from rayflow.backends.kuberay.kube import Kube

    stack, name = local_kube, "raced"
    winner = backend(stack, f"backend.cluster_name={name}").manifest({"rayflow.io/run": "run-a"})
    uid = stack.put(suspended(winner), tmp_path)["metadata"]["uid"]
    real_get, calls = Kube.get, []

    def first_get_misses(self, kind, name):  # the loser's first look came before the create
        calls.append(name)
        return None if len(calls) == 1 else real_get(self, kind, name)

    monkeypatch.setattr(Kube, "get", first_get_misses)
    try:
        mark = stack.mark()
        error = refused(stack, f"backend.cluster_name={name}")
        assert "belongs to another rayflow run" in str(error)
        assert "is not this run's (rayflow.io/run=" in capsys.readouterr().out
        assert stack.get("raycluster", name)["metadata"]["uid"] == uid
        asked = stack.asked_since(mark)
        creates = [
            e
            for e in asked
            if e["verb"] == "create" and e["objectRef"]["resource"] == "rayclusters"
        ]
        # its dry run (the server's validation) first, then the create: both refused
        assert [
            ("dryRun=All" in e["requestURI"], e["responseStatus"]["code"]) for e in creates
        ] == [
            (True, 409),
            (False, 409),
        ]
        assert all("fieldManager=rayflow" in e["requestURI"] for e in creates)
        assert not [e for e in asked if e["verb"] == "delete"], "the loser deleted nothing"
    finally:
        monkeypatch.setattr(Kube, "get", real_get)
        gone(stack, "raycluster", name)


def test_a_raycluster_rayflow_did_not_make_is_joined_only_when_trusted_by_uid(local_kube, tmp_path):
    """Issue 43: joining is by proof, not by name. A RayCluster made outside rayflow is refused
    with keep_cluster false or true, naming how to trust it (backend.join_uid), and nothing
    reaches its dashboard (joining it by its uid: test_kuberay_local_user.py)."""
    stack, name = local_kube, "theirs"
    theirs = backend(stack, f"backend.cluster_name={name}").manifest()
    theirs["metadata"]["labels"] = {"team": "ml"}
    stack.put(suspended(theirs), tmp_path)
    try:
        mark = stack.mark()
        for more in ((), KEEP):
            error = refused(stack, f"backend.cluster_name={name}", *more)
            assert error.key == "backend.cluster_name"
            assert "no run of yours made and kept it" in str(error)
            assert f"backend.join_uid=<kubectl get raycluster {name} -n default -o" in str(error)
        assert reached(stack, mark) == []
        assert stack.get("raycluster", name)["metadata"]["labels"] == {"team": "ml"}
    finally:
        gone(stack, "raycluster", name)


def test_an_existing_rayjob_is_never_taken_over(local_kube, tmp_path):
    stack, name = local_kube, "their-job"
    other = backend(stack, "backend.mode=rayjob", f"backend.cluster_name={name}").manifest(
        {"rayflow.io/run": "someoneelse"}
    )
    stack.put(suspended(other), tmp_path)
    try:
        error = refused(stack, "backend.mode=rayjob", f"backend.cluster_name={name}")
        assert f"RayJob default/{name} already exists (made by rayflow run someoneelse)" in str(
            error
        )
        labels = stack.get("rayjob", name)["metadata"]["labels"]
        assert labels["rayflow.io/run"] == "someoneelse"
    finally:
        gone(stack, "rayjob", name)


def test_join_uid_is_checked_against_what_is_there(local_kube, tmp_path):
    """backend.join_uid names one object: with none under the name, or another one than is
    there now, the run is refused in one line naming the key; nothing is created or reached."""
    stack, name = local_kube, "trusted"
    uid = "6f1c4b2e-8d3a-4f5b-9c7d-0e1f2a3b4c5d"
    mark = stack.mark()
    error = refused(stack, f"backend.cluster_name={name}", *KEEP, f"backend.join_uid={uid}")
    assert error.key == "backend.join_uid"
    assert f"there is no RayCluster default/{name} to join" in str(error)
    assert not [e for e in stack.asked_since(mark) if e["verb"] == "create"], "nothing created"
    stack.put(suspended(backend(stack, f"backend.cluster_name={name}").manifest()), tmp_path)
    try:
        error = refused(stack, f"backend.cluster_name={name}", *KEEP, f"backend.join_uid={uid}")
        assert error.key == "backend.join_uid" and f"has another uid than {uid}" in str(error)
        assert reached(stack, mark) == []
    finally:
        gone(stack, "raycluster", name)


def test_a_trusted_cluster_with_kubernetes_token_auth_and_direct_access_gets_nothing(
    local_kube, tmp_path
):
    """A RayCluster made outside rayflow, with Kubernetes token auth, trusted by its uid, with
    backend.dashboard_access=service: refused in one line before anything is sent to it."""
    stack, name = local_kube, "k8s-auth"
    theirs = backend(stack, f"backend.cluster_name={name}", *K8S_AUTH).manifest()
    theirs["metadata"]["labels"] = {"team": "ml"}
    uid = stack.put(suspended(theirs), tmp_path)["metadata"]["uid"]
    try:
        mark = stack.mark()
        error = refused(
            stack,
            f"backend.cluster_name={name}",
            *KEEP,
            f"backend.join_uid={uid}",
            "backend.dashboard_access=service",
        )
        assert error.key == "backend.dashboard_access"
        assert reached(stack, mark) == []
    finally:
        gone(stack, "raycluster", name)


def test_a_head_service_someone_else_made_under_its_name_gets_nothing(local_kube, tmp_path):
    """A Service named and labelled as KubeRay names and labels the head's (`<cluster>-head-svc`),
    made by someone else first: the real operator takes it for the head's and starts the head,
    but the run stops in one line, neither the Ray token nor anything else goes through that
    Service, and the cluster the run made is deleted."""
    from rayflow.errors import ClusterError

    stack, name = local_kube, "squatted"
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{name}-head-svc",
            "namespace": "default",
            "labels": {  # what the operator looks its head Service up by
                "ray.io/cluster": name,
                "ray.io/node-type": "head",
                "ray.io/identifier": f"{name}-head",
            },
        },
        # the pods it reaches are whatever they say: here the head rayflow's run will make
        "spec": {
            "selector": {"ray.io/cluster": name, "ray.io/node-type": "head"},
            "ports": [{"name": "dashboard", "port": 8265}],
        },
    }
    stack.put(service, tmp_path)
    try:
        mark = stack.mark()
        error = refused(stack, f"backend.cluster_name={name}", error=ClusterError)
        assert f"is not RayCluster default/{name}'s" in str(error)
        assert not [e for e in stack.asked_since(mark) if "/proxy" in e["requestURI"]]
        assert wait_until(lambda: stack.left(name) == [f"services/{name}-head-svc"], 60)
    finally:
        gone(stack, "service", f"{name}-head-svc")


# --- the autostop's RBAC on a ServiceAccount of rayflow's own ------------------------------------

SQUATTED = {
    "ServiceAccount": {"apiVersion": "v1", "kind": "ServiceAccount"},
    "Role": {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}],
    },
    "RoleBinding": {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "subjects": [{"kind": "ServiceAccount", "name": "theirs", "namespace": "default"}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "theirs"},
    },
}
PLURAL = {"ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings"}


@pytest.mark.parametrize(
    "kind,race",
    [("ServiceAccount", False), ("Role", False), ("RoleBinding", False), ("Role", True)],
)
def test_an_autostop_object_rayflow_did_not_make_turns_autostop_off_and_is_untouched(
    local_kube, tmp_path, monkeypatch, capsys, kind, race
):
    """Someone made a ServiceAccount, Role or RoleBinding of the autostop's name first: autostop is
    off, in one line saying why; that object is neither reused nor changed, and nothing is bound
    to it. Seen before the RayCluster is made (its head then does not run as that account), or
    only at the create, as a 409 (made in between: nothing more is created). What the run sent is
    read from the audit log: its head is left unschedulable, so the run ends at the head wait,
    and its cluster, kept but never reached, is deleted."""
    from rayflow.backends.kuberay.kube import Kube
    from rayflow.errors import ClusterError

    stack, name = local_kube, f"squat-{kind.lower()}{'-race' if race else ''}"
    account = f"{name}-rayflow-autostop"
    theirs = stack.put(
        {**SQUATTED[kind], "metadata": {"name": account, "namespace": "default"}}, tmp_path
    )
    if race:  # made between rayflow's look and its create
        look = Kube.read_object
        monkeypatch.setattr(
            Kube,
            "read_object",
            lambda self, kind, name: None if kind in PLURAL else look(self, kind, name),
        )
    try:
        mark = stack.mark()
        error = refused(
            stack,
            f"backend.cluster_name={name}",
            "backend.keep_cluster=true",
            "backend.autostop_idle_minutes=5",
            *NOWHERE,
            error=ClusterError,
        )
        assert "no node can hold the head pod" in str(error)
        [line] = [l for l in capsys.readouterr().err.splitlines() if "autostop is off" in l]
        assert line.startswith(
            f"rayflow: warning: autostop is off: {kind} default/{account} already exists and this "
            "run did not make it"
        )
        now = stack.get(PLURAL[kind], account)
        assert now["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
        sent = [
            e
            for e in stack.asked_since(mark)
            if e["verb"] == "create"
            and e["responseStatus"]["code"] < 300
            and "dryRun" not in e["requestURI"]
        ]
        made = {e["objectRef"]["resource"]: e.get("requestObject") or {} for e in sent}
        assert "rolebindings" not in made, "nothing is bound"
        head = made["rayclusters"]["spec"]["headGroupSpec"]["template"]["spec"]
        if not race:
            assert head.get("serviceAccountName") is None, "the head runs as no account of theirs"
        for plural in PLURAL.values():  # what this run made is owned by its RayCluster
            if plural in made:
                [owner] = made[plural]["metadata"]["ownerReferences"]
                assert owner["kind"] == "RayCluster" and owner["name"] == name
        # kept, but its start failed: deleted, as no rayflow command would see it (unrecorded)
        assert wait_until(lambda: not stack.left(name), timeout=60), stack.left(name)
    finally:
        stack.kube.kubectl("delete", "raycluster", name, "--ignore-not-found", "--wait=false")
        gone(stack, PLURAL[kind], account)


# --- Kubernetes RBAC token auth: the user's own Kubernetes token, checked by the head ------------


def _token_kubeconfig(stack, account: str, path) -> dict:
    """A kubeconfig whose user is ServiceAccount `account`'s bearer token (no certificate): how a
    user reaches a cluster through an OIDC or exec plugin, here with a TokenRequest token."""
    import json

    token = stack.kube.kubectl("create", "token", account, "--duration=1h").strip()
    plane = stack.kube.plane
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": plane.server,
                    "certificate-authority": str(plane.folder / "pki" / "ca.crt"),
                },
            }
        ],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": "local", "user": account}}],
        "current-context": account,
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return config


def _k8s_auth_rbac(stack, name: str, tmp_path) -> list[tuple[str, str]]:
    """What KubeRay's sample (ray-cluster.kubernetes.auth.yaml) binds, for RayCluster `name`:
    the head's account (the one the operator makes for the autoscaler, named after the cluster)
    may review tokens (system:auth-delegator) and, as every Ray process presents its pod's
    token, `ray:write`; so may the workers' (`default`): their Ray servers check the tokens of
    calls to them too. Alice may do anything; Bob may only reach Services through the proxy."""
    for account in ("alice", "bob"):
        stack.kube.kubectl("create", "serviceaccount", account)
    kubectl = stack.kube.kubectl
    kubectl(
        "create", "role", f"{name}-ray-writer", "--verb=ray:write", "--resource=rayclusters.ray.io"
    )
    kubectl(
        "create",
        "rolebinding",
        f"{name}-ray-writer",
        f"--role={name}-ray-writer",
        f"--serviceaccount=default:{name}",
        "--serviceaccount=default:default",  # the workers'
    )
    kubectl(
        "create",
        "clusterrolebinding",
        f"{name}-delegator",
        "--clusterrole=system:auth-delegator",
        f"--serviceaccount=default:{name}",
        "--serviceaccount=default:default",  # the workers'
    )
    kubectl(
        "create",
        "clusterrolebinding",
        f"{name}-alice",
        "--clusterrole=cluster-admin",
        "--serviceaccount=default:alice",
    )
    kubectl("create", "role", f"{name}-proxy", "--verb=get,create", "--resource=services/proxy")
    kubectl(
        "create",
        "rolebinding",
        f"{name}-bob",
        f"--role={name}-proxy",
        "--serviceaccount=default:bob",
    )
    return [
        ("clusterrolebinding", f"{name}-delegator"),
        ("clusterrolebinding", f"{name}-alice"),
        ("rolebinding", f"{name}-bob"),
        ("role", f"{name}-proxy"),
        ("rolebinding", f"{name}-ray-writer"),
        ("role", f"{name}-ray-writer"),
        ("serviceaccount", "alice"),
        ("serviceaccount", "bob"),
    ]


ON_A_WORKER = (
    'python -c "import ray, socket; ray.init(); '
    "print('ran on a worker', ray.get(ray.remote(num_cpus=1)(lambda: socket.gethostname()).remote()))\""
)


def test_with_kubernetes_token_auth_the_jobs_client_sends_the_users_own_kubernetes_token(
    local_kube, tmp_path
):
    """KubeRay's enableK8sTokenAuth (Ray >= 2.55): no Ray token and no Secret; Ray's head checks
    the bearer token of each Jobs API request with the real API server (TokenReview, then RBAC
    verb `ray:write` on RayClusters). rayflow passes on the user's own Kubernetes token through
    the API server's service proxy, in place of any Ray token the client holds; the head accepts
    Alice's and refuses Bob's, though Bob may use the proxy."""
    import requests
    from ray.job_submission import JobSubmissionClient

    stack, name = local_kube, "k8s-auth"
    made = _k8s_auth_rbac(stack, name, tmp_path)
    try:
        alice = tmp_path / "alice.kubeconfig"
        _token_kubeconfig(stack, "alice", alice)
        mark = stack.mark()
        with running(
            backend(
                stack,
                f"backend.cluster_name={name}",
                f"backend.kubeconfig={alice}",
                "backend.min_worker_nodes=1",
                *K8S_AUTH,
            )
        ) as b:
            applied = stack.get("raycluster", name)["spec"]["authOptions"]
            assert applied == {"mode": "token", "enableK8sTokenAuth": True}
            assert "Authorization" not in b.submission.headers
            # whatever Ray token the client holds locally is replaced by Alice's Kubernetes token
            local = {"Authorization": "Bearer a-local-ray-token"}
            client = JobSubmissionClient(b.address, headers={**b.submission.headers, **local})
            assert client.list_jobs() == []
            # a task on the worker pod (the head has no CPU for it): Ray's calls between the
            # pods carry their accounts' tokens, each checked by the pod it reaches
            job = client.submit_job(entrypoint=ON_A_WORKER)
            assert wait_until(
                lambda: client.get_job_status(job).is_terminal(), timeout=180, interval=1
            ), (client.get_job_logs(job)[-2000:], stack.phases(), stack.operator_said(name))
            assert client.get_job_status(job) == "SUCCEEDED", client.get_job_logs(job)[-2000:]
            assert "ran on a worker" in client.get_job_logs(job)
            bob = _token_kubeconfig(stack, "bob", tmp_path / "bob.kubeconfig")
            bob_token = bob["users"][0]["user"]["token"]
            plane = stack.kube.plane
            answer = requests.get(
                f"{plane.server}/api/v1/namespaces/default/services/{name}-head-svc:dashboard"
                "/proxy/api/jobs/",
                verify=str(plane.folder / "pki" / "ca.crt"),
                headers={
                    "Authorization": f"Bearer {bob_token}",
                    "X-Ray-Authorization": f"Bearer {bob_token}",
                },
                timeout=30,
            )
            assert answer.status_code in (401, 403), (answer.status_code, answer.text[:300])
        asked = stack.kube.plane.audit.since(mark)
        mine = [
            e
            for e in asked
            if e.get("user", {}).get("username") == "system:serviceaccount:default:alice"
        ]
        assert any("/proxy/api/jobs" in e["requestURI"] for e in mine), "the jobs went as Alice"
        secrets = [e for e in mine if (e.get("objectRef") or {}).get("resource") == "secrets"]
        assert secrets == [], "no Ray token is read with Kubernetes token auth"
        assert not stack.get("secrets", "--field-selector", f"metadata.name={name}")["items"]
    finally:
        for kind, obj in made:
            stack.kube.kubectl("delete", kind, obj, "--ignore-not-found")
    assert wait_until(lambda: not stack.left(name), timeout=60), stack.left(name)
