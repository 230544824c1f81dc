// Package packaging holds no code, only the tests that check every packaging
// artifact by machine: the Helm chart (lint, rendering, a dry-run apply to a
// real kube-apiserver, ServiceAccount permissions through
// SubjectAccessReviews), the daemonless image archives from scripts/image (the
// one build path of the images), the release script, and the clusterctl
// release manifests.
package packaging
