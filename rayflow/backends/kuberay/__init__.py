"""backend=kuberay: a RayCluster or RayJob made by the KubeRay operator. `cluster`
(KubeRayCluster: apply, wait, submit, delete), `manifest` (the `backend:` section -> the
manifest), `crd` and `metadata` (KubeRay's CRD schema as the API server applies it, crds/),
`user_manifest` and `user_layers` (backend.manifest=PATH: the user's own file, and what rayflow puts
on top of it), `checks` (the operator's own rules), `resources` (Kubernetes quantities; what the
pods give Ray), `kube` (the API calls), `wait` (the head pod's start-up) and `relay` (the Jobs API
through the API server's service proxy)."""
