"""A real Kubernetes control plane with the KubeRay operator on this Linux machine, for the tests
and for users who want to try `backend=kuberay` on one machine (issue 45, in progress): `build`
(the binaries, from their Go modules), `pki` (its certificates), `control_plane` (etcd, the API
server, the controller-manager, the scheduler and the operator as processes). The process kubelet
and `scripts/kube-local.sh` are still to come."""
