// Package difftest runs one table of client calls against a real
// kube-apiserver (envtest) and against dev-k8s and requires the normalized
// answers to agree. It holds only tests.
package difftest
