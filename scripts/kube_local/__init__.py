"""A real Kubernetes control plane with the KubeRay operator on this Linux machine, for the tests
and for users who want to try `backend=kuberay` on one machine (issue 45, in progress): `build`
(the binaries, from their Go modules), `pki` (its certificates)."""
