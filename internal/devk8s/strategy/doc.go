// Package strategy holds the rules of each built-in resource dev-k8s
// serves, the way kube-apiserver's REST strategies do: one file per
// resource declares its registry entry (Resource) and implements Strategy
// (defaults, create and update preparation, validation), plus the optional
// capabilities it needs (status updates, field selectors, table columns,
// name rules, graceful or finalizing deletion, hand-edited files, a
// controller). The apiserver looks a resource's strategy up and calls it;
// Generic covers custom resources and built-ins without rules of their own.
//
// Adding a built-in resource touches this package only: a new file with
// its Resource and rules, and one line in Builtins.
package strategy
