"""backend=kuberay: a RayCluster or RayJob made by the KubeRay operator. `cluster`
(KubeRayCluster: apply, wait, submit, delete), `keys` (its keys, Kubernetes quantities and names),
`manifest` (the `backend:` section -> the manifest), `crd` and `metadata` (KubeRay's CRD schema
and ObjectMeta as the API server applies them, crds/), `user_manifest` and `user_layers`
(backend.manifest=PATH: the user's own file, and what rayflow puts on top of it), `checks` (the
operator's own rules), `resources` (what the pods give Ray), `kube` (the API calls), `wait` (the
head pod's start-up), `relay` (the Jobs API through the API server's service proxy), `ownership`
(which RayCluster a run or command may treat as this user's own: by proof, never by name) and
`autostop` (what lets a kept RayCluster delete itself once idle, with no copied credential)."""
