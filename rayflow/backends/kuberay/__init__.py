"""backend=kuberay: a RayCluster or RayJob made by the KubeRay operator. `cluster`
(KubeRayCluster: apply or join, submit), `applied` (the object a run applied or joined: its head
and dashboard reached, deleted by uid), `kept` (a kept RayCluster's life: kept and joined by proof,
reached and deleted from its record, and what lets it delete itself once idle, with no copied
credential), `keys` (its keys, Kubernetes quantities and names), `manifest` (the `backend:` section
-> the manifest), `crd` and `metadata` (KubeRay's CRD schema and ObjectMeta as the API server
applies them, crds/), `user_manifest` and `user_layers` (backend.manifest=PATH: the user's own
file, and what rayflow puts on top of it), `checks` (the operator's own rules), `resources` (what
the pods give Ray), `kube` (the API calls), `wait` (the head pod's start-up), `relay` (the Jobs API
through the API server's service proxy) and `ownership` (which RayCluster a run or command may
treat as this user's own: by proof, never by name)."""
