// Package packaging holds no code, only the tests that check every packaging
// artifact by machine: the Helm chart (lint, rendering, a dry-run apply to a
// real kube-apiserver, ServiceAccount permissions through
// SubjectAccessReviews), the Containerfiles, the daemonless image archives from
// scripts/image, and the clusterctl release manifests.
package packaging
