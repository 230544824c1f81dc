// Package nodeauthz decides what a kubelet's identity may do in dev-k8s: a
// small rule set in the spirit of kube-apiserver's Node authorizer plus the
// NodeRestriction admission plugin, written for the requests a kubelet makes
// (the real ones live in k8s.io/kubernetes, which the main module does not
// depend on).
//
// It applies to users in the system:nodes group (unless they are also in
// system:masters, which kube-apiserver lets do everything). A user named
// system:node:<name> is the node <name>; a member of system:nodes without
// that prefix is no node and is refused everything but discovery. Every other
// user is not this package's business (dev-k8s lets them do everything).
//
// A node may:
//   - read its own Node (get, or list/watch with fieldSelector
//     metadata.name=<name>), create it, update and patch it and its status,
//     without changing its taints or ownerReferences and setting only the
//     labels kubelets set (or labels outside kubernetes.io and k8s.io);
//   - get, create, update, patch and delete the Lease named after it in
//     kube-node-lease, and the CSINode named after it;
//   - create, update and patch Events (core and events.k8s.io);
//   - list and watch pods with fieldSelector spec.nodeName=<name>; get, delete,
//     evict and update or patch the status of pods bound to it; create mirror
//     pods (annotation kubernetes.io/config.mirror) bound to it;
//   - get, list and watch (by name) the Secrets and ConfigMaps that pods
//     bound to it reference, and request tokens for their ServiceAccounts;
//   - read Services, CSIDrivers and RuntimeClasses, get Endpoints and
//     VolumeAttachments; create TokenReviews, SubjectAccessReviews,
//     self-reviews and CertificateSigningRequests (and read those);
//   - read the discovery, version, health and OpenAPI paths.
//
// Everything else is 403 Forbidden, with a Status shaped like
// kube-apiserver's. Limits, known and accepted: relationships are looked up
// in the store at request time (no graph), so a node may read a Secret as soon
// as a pod bound to it names the Secret; PersistentVolumes, ResourceClaims,
// ResourceSlices and PodCertificateRequests are not covered (refused);
// NodeRestriction's checks of a pod status write's content and of a token
// request's audience and bound object are not made. internal/devk8s/difftest
// compares a kubelet's answers with kube-apiserver's (Node,RBAC and
// NodeRestriction).
package nodeauthz
